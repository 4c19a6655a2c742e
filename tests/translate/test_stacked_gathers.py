"""A gather of one layer's row-sharded weight out of a stack is the layer's weight
(Builder.concat_of_reshapes, joined along the dim the stack was cut on).

Each device holds `stack[:, rows_d, :]` and takes layer i as a [1, rows/n, d] window, squeezed; the
gathered pieces are joined by rows, not stacked along the size-1 layer dim (the same layout, but
only the rows' windows merge back into the layer). Checked on the terms the evaluator builds, and
on JAX programs in a style unlike the blind FSDP-over-scan cases: a fori_loop over a dict of stacked
weights (and a near miss that gathers column shards as if they were rows).
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
from equivci.translate.evaluator import Evaluator


def test_row_shards_of_one_layer_are_joined_along_the_rows() -> None:
    ev = Evaluator(None, TermTable(), 1)
    stack = ev.table.make("param", (0,), (), (3, 8, 5), "f32")
    layer = 1
    pieces = []
    for d in range(4):
        rows = ev.slice_term(stack, 1, 2 * d, 2 * d + 2)
        one = ev.slice_term(rows, 0, layer, layer + 1)
        pieces.append(ev.reshape_term(one, Shape("f32", (2, 5))))
    gathered = ev.concat(pieces, 0)
    joined = gathered.args[0]  # the rows' windows merged back into the layer: one window of the stack
    assert gathered.op == "reshape" and joined.op == "slice" and joined.attrs == (0, layer, layer + 1)
    assert joined.args[0] is stack
    value = np.random.default_rng(0).standard_normal((3, 8, 5)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(gathered, {0: value}), value[layer])


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    L, D, T = 3, 8, 8


    def inputs():
        f32 = jnp.float32
        return ({"w": jax.ShapeDtypeStruct((L, D, D), f32), "g": jax.ShapeDtypeStruct((L, D), f32)},
                jax.ShapeDtypeStruct((T, D), f32))


    def _block(h, w, g):
        return h + jax.nn.silu(h @ w) * g


    def reference(params, h):
        for i in range(L):
            h = _block(h, params["w"][i], params["g"][i])
        return h


    def _sharded(params, h, mesh, spec, gather):
        def body(params, h):
            def one(i, h):
                return _block(h, gather(params["w"][i]), params["g"][i])  # MARK:gather

            return lax.fori_loop(0, L, one, h)

        return jax.shard_map(body, mesh=mesh, in_specs=({"w": spec, "g": P()}, P("fsdp")),
                             out_specs=P("fsdp"))(params, h)


    def rows(params, h, *, mesh):
        return _sharded(params, h, mesh, P(None, "fsdp", None), lambda w: lax.all_gather(w, "fsdp", axis=0, tiled=True))


    def columns_as_rows(params, h, *, mesh):
        def gather(w):
            return lax.all_gather(w, "fsdp", axis=0, tiled=True).reshape(D, D)

        return _sharded(params, h, mesh, P(None, None, "fsdp"), gather)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: rows, reference: m.py:reference, distributed: m.py:rows, inputs: m.py:inputs, mesh: {fsdp: 4}}
      - {name: columns-as-rows, reference: m.py:reference, distributed: m.py:columns_as_rows, inputs: m.py:inputs,
         mesh: {fsdp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("stacked"), "m.py", MODELS, MANIFEST)


def test_layer_rows_gathered_in_a_fori_loop_verify(manifest) -> None:
    result = _verify(manifest, "rows")
    assert result.status is Status.VERIFIED, result.findings


def test_column_shards_gathered_as_rows_are_a_mismatch(manifest) -> None:
    result = _verify(manifest, "columns-as-rows")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
