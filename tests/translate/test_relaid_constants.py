"""One constant table laid out with other unit dims is one table (equivci/translate/constants.py:
ConstantPool.relaid, Builder.const).

The fact: a constant whose elements, in order, are a known constant's with unit dims inserted or
dropped is that constant reshaped (exact: a reshape that only moves unit dims moves no element). A
reference that vmaps `positions[:, None] * inv_freq[None, :]` folds the frequencies to [1, 1, d]
and reshapes them to [d]; a device that writes `positions[..., None] * inv_freq` holds its own [d]
constant. Built as the reshape of the reference's table, the device's is the very term the
reference's reshape is (ChatGLM's 2-D RoPE: `glm-2d-rope-tp` of blind split 12). Near misses: the
same elements in another order, or in another layout of non-unit dims, are other tables.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest

from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.translate.builder import Builder
from equivci.translate.constants import ConstantPool

FREQ = (1.0 / 10000.0 ** (np.arange(4) / 4)).astype(np.float32)


def test_a_table_with_other_unit_dims_is_found_as_the_same_table() -> None:
    pool = ConstantPool()
    term = TermTable().make("const", ("reference",), (), (1, 1, 4), "f32")
    pool.add(term, FREQ.reshape(1, 1, 4), "f32")
    assert pool.relaid(FREQ, "f32") is term
    assert pool.relaid(FREQ.reshape(4, 1), "f32") is term


def test_near_miss_other_order_layout_or_dtype_is_another_table() -> None:
    pool = ConstantPool()
    pool.add(TermTable().make("const", ("reference",), (), (1, 4), "f32"), np.tile(FREQ, 1).reshape(1, 4), "f32")
    assert pool.relaid(FREQ[::-1].copy(), "f32") is None
    assert pool.relaid(FREQ.reshape(2, 2), "f32") is None
    assert pool.relaid(FREQ, "f64") is None


def test_the_builder_makes_the_table_the_reshape_of_the_known_one() -> None:
    ev = Builder(None, TermTable(), 1)  # type: ignore[arg-type]
    table = ev.const(FREQ.reshape(1, 1, 4), "f32")
    flat = ev.const(FREQ.copy(), "f32")
    assert flat.op == "reshape" and flat.args == (table,) and flat.shape == (4,)
    np.testing.assert_array_equal(ev.folded(flat), FREQ)
    assert ev.const(FREQ[::-1].copy(), "f32").op == "const"  # near miss: its own table


MODELS = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    B, S = 4, 8
    FREQ = (1.0 / 10000.0 ** (np.arange(4) / 4)).astype(np.float32)

    def inputs():
        return jax.ShapeDtypeStruct((B, S, 4), jnp.float32), jax.ShapeDtypeStruct((B, S), jnp.int32)

    def vmapped(x, pos):
        ang = jax.vmap(lambda p: p[:, None].astype(jnp.float32) * FREQ[None, :])(pos)
        return x * jnp.sin(ang)

    def explicit(x, pos):
        return x * jnp.sin(pos[:, :, None].astype(jnp.float32) * FREQ.reshape(1, 1, 4))

    def _sharded(freq):
        def local(x, pos):
            return x * jnp.sin(pos[..., None].astype(jnp.float32) * freq)
        def run(x, pos, mesh):
            return jax.shard_map(local, mesh=mesh, in_specs=(P("tp"), P("tp")), out_specs=P("tp"))(x, pos)
        return run

    sharded = _sharded(FREQ)
    sharded_reversed = _sharded(FREQ[::-1].copy())
    """
)

MANIFEST = textwrap.dedent(
    """
    version: 1
    models:
      - {name: vmapped, reference: m.py:vmapped, distributed: m.py:sharded, inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: explicit, reference: m.py:explicit, distributed: m.py:sharded, inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: reversed, reference: m.py:vmapped, distributed: m.py:sharded_reversed, inputs: m.py:inputs,
         mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("relaid_constants"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["vmapped", "explicit"])
def test_frequencies_laid_out_two_ways_verify(manifest, name) -> None:
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_near_miss_frequencies_in_another_order_are_no_proof(manifest) -> None:
    assert model_package.verify_named(manifest, "reversed").status is Status.MISMATCH
