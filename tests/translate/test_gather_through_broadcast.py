"""A gather through an elementwise op with a broadcast operand (equivci.translate.gathers):
gather(x - bcast(m), i) = gather(x, i) - m when m is constant along the dims the gather indexes.
With the rule -(a - b) = b - a (elementwise/negate_subtract_*), a reference that negates the
label's entry of x - max against a class-parallel program that subtracts its pick from the max.

Checked numerically on the builder's normal form, refused where m varies along the indexed dim,
and end to end on a class-parallel max-margin head (a style unlike the blind token cross-entropy:
a classifier over [batch, classes] under shard_map with `jnp.take_along_axis` on a 2-D score, the
pick masked with `jnp.where`, the max taken by `lax.pmax`) beside two near misses: the max not
reduced over shards, and the sign flipped.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import GatherDims, bcast_spec
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(0)
# take_along_axis(x [4, 6], i [4]) along dim 1: batch dim 0 with the index's dim 0
DIMS = GatherDims(
    offset=(), collapsed=(1,), start_map=(1,), operand_batch=(0,), indices_batch=(0,), vector_dim=1, slice_sizes=(1, 1)
)


def _gather(m_dims: tuple[int, ...], m_shape: tuple[int, ...]):
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (4, 6), "f32")
    m = ev.table.make("param", (1,), (), m_shape, "f32")
    idx = ev.table.make("param", (2,), (), (4, 1), "s32")
    spread = ev.mk("bcast", (bcast_spec(len(m_shape), (4, 6), m_dims),), [m], Shape("f32", (4, 6)))
    shifted = ev.mk("binary", ("subtract",), [x, spread], Shape("f32", (4, 6)))
    return ev.gather_term(shifted, idx, DIMS, Shape("f32", (4,))), (x, m_shape)


def test_a_gather_of_x_minus_a_row_constant_is_the_gather_minus_it() -> None:
    term, (_, m_shape) = _gather((0,), (4,))
    assert term is not None and term.op == "binary" and term.args[0].op == "aligned"
    values = {0: RNG.standard_normal((4, 6)), 1: RNG.standard_normal(m_shape), 2: RNG.integers(0, 6, (4, 1))}
    expected = np.take_along_axis(values[0] - values[1][:, None], values[2], axis=1)[:, 0]
    np.testing.assert_allclose(evaluate(term, values), expected, rtol=1e-6)


def test_a_broadcast_that_varies_along_the_indexed_dim_stays_under_the_gather() -> None:
    term, _ = _gather((1,), (6,))  # a per-class bias: it is picked at the label too
    assert term is not None and term.op == "aligned"


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    N, D, C = 4, 8, 16


    def inputs():
        return (jax.ShapeDtypeStruct((N, D), jnp.float32), jax.ShapeDtypeStruct((D, C), jnp.float32),
                jax.ShapeDtypeStruct((N,), jnp.int32))


    def margin(x, w, y):
        s = x @ w
        gap = s - s.max(axis=1, keepdims=True)
        return -jnp.take_along_axis(gap, y[:, None], axis=1)[:, 0]


    def _class_parallel(x, w, y, mesh, top_of, sign):
        def shard(x, w, y):
            s = x @ w
            c = s.shape[1]
            lo = lax.axis_index("c") * c
            mine = (y >= lo) & (y < lo + c)
            pick = jnp.take_along_axis(s, jnp.where(mine, y - lo, 0)[:, None], axis=1)[:, 0]
            pick = lax.psum(jnp.where(mine, pick, 0.0), "c")
            top = top_of(s.max(axis=1))
            return sign * (top - pick)

        return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(None, "c"), P()), out_specs=P(),
                             check_vma=False)(x, w, y)


    def margin_cp(x, w, y, *, mesh):
        return _class_parallel(x, w, y, mesh, lambda m: lax.pmax(m, "c"), 1.0)


    def margin_cp_local_max(x, w, y, *, mesh):
        return _class_parallel(x, w, y, mesh, lambda m: m, 1.0)


    def margin_cp_sign(x, w, y, *, mesh):
        return _class_parallel(x, w, y, mesh, lambda m: lax.pmax(m, "c"), -1.0)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: cp, reference: m.py:margin, distributed: m.py:margin_cp, inputs: m.py:inputs, mesh: {c: 4}}
      - {name: cp-local-max, reference: m.py:margin, distributed: m.py:margin_cp_local_max, inputs: m.py:inputs,
         mesh: {c: 4}}
      - {name: cp-sign, reference: m.py:margin, distributed: m.py:margin_cp_sign, inputs: m.py:inputs, mesh: {c: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("margin"), "m.py", MODELS, MANIFEST)


def test_a_class_parallel_margin_verifies(manifest) -> None:
    result = _verify(manifest, "cp")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["cp-local-max", "cp-sign"])
def test_a_local_max_or_a_flipped_sign_is_a_mismatch(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
