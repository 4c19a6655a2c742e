"""A slice of a reshape of a window is one window when its elements are one box of the base
(equivci.translate.builder.Builder.reshaped_window with a last slice): a fused [k|v] projection
viewed [.., 2, kv_heads, head_dim], one KV head taken and then its k, is one column window of
the projection.

Checked numerically on the terms the builder makes, its guard (the elements must be one box) on a
near miss, and on JAX programs in a style unlike the blind GQA case (there the weight is sliced per
device; here every device projects all KV heads and picks its own from the activations): GQA with
more devices than KV heads verifies, and a near miss that reads k from the v half is a mismatch.
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

RNG = np.random.default_rng(0)


def _kv_head(ev: Evaluator, head: int, part: int):
    """proj [2, 3, 40] -> columns 8:40 viewed [2, 3, 2 (k|v), 2 (heads), 8] -> head `head`, k or v."""
    proj = ev.table.make("param", (0,), (), (2, 3, 40), "f32")
    kv = ev.reshape_term(ev.slice_term(proj, 2, 8, 40), Shape("f32", (2, 3, 2, 2, 8)))
    one_head = ev.slice_term(kv, 3, head, head + 1)
    return ev.slice_term(one_head, 2, part, part + 1)


def test_one_head_of_a_fused_kv_view_is_a_window_of_the_projection() -> None:
    ev = Evaluator(None, TermTable(), 1)
    term = _kv_head(ev, 1, 0)
    assert term.op == "reshape" and term.args[0].op == "slice" and term.args[0].attrs == (2, 16, 24)
    value = RNG.standard_normal((2, 3, 40))
    expected = value[..., 8:].reshape(2, 3, 2, 2, 8)[:, :, 0:1, 1:2, :]
    np.testing.assert_array_equal(evaluate(term, {0: value}), expected)


def test_a_slice_of_a_reshaped_window_that_is_no_box_stays_a_slice() -> None:
    # both k and v of one head: columns 16:24 and 32:40, two boxes
    ev = Evaluator(None, TermTable(), 1)
    proj = ev.table.make("param", (0,), (), (2, 3, 40), "f32")
    kv = ev.reshape_term(ev.slice_term(proj, 2, 8, 40), Shape("f32", (2, 3, 2, 2, 8)))
    term = ev.slice_term(kv, 3, 1, 2)
    assert term.op == "slice" and term.args[0] is kv
    value = RNG.standard_normal((2, 3, 40))
    np.testing.assert_array_equal(evaluate(term, {0: value}), value[..., 8:].reshape(2, 3, 2, 2, 8)[:, :, :, 1:2])


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, H, G, K = 2, 4, 16, 4, 2, 4


    def gqa_inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((D, H * K), f32),
                jax.ShapeDtypeStruct((D, 2 * G * K), f32), jax.ShapeDtypeStruct((H * K, D), f32))


    def _attend(q, k, v):
        p = jax.nn.softmax(jnp.einsum("bshk,bthk->bhst", q, k), axis=-1)
        return jnp.einsum("bhst,bthk->bshk", p, v)


    def gqa(x, wq, wkv, wo):
        q = (x @ wq).reshape(B, S, H, K)
        kv = (x @ wkv).reshape(B, S, 2, G, K)
        k, v = (jnp.repeat(kv[:, :, i], H // G, axis=2) for i in range(2))
        return _attend(q, k, v).reshape(B, S, H * K) @ wo


    def _gqa_tp(x, wq, wkv, wo, mesh, k_index):
        def body(x, wq, wkv, wo):
            g = lax.axis_index("tp") // (mesh.shape["tp"] // G)
            kv = (x @ wkv).reshape(B, S, 2, G, K)
            mine = lax.dynamic_slice_in_dim(kv, g, 1, axis=3)
            q = (x @ wq).reshape(B, S, 1, K)
            k, v = mine[:, :, k_index], mine[:, :, 1 - k_index]
            return lax.psum(_attend(q, k, v).reshape(B, S, K) @ wo, "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P(), P("tp", None)),
                             out_specs=P())(x, wq, wkv, wo)


    def gqa_tp(x, wq, wkv, wo, *, mesh):
        return _gqa_tp(x, wq, wkv, wo, mesh, 0)


    def gqa_tp_k_from_v(x, wq, wkv, wo, *, mesh):
        return _gqa_tp(x, wq, wkv, wo, mesh, 1)  # MARK:k_from_v
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: gqa-activation-heads, reference: m.py:gqa, distributed: m.py:gqa_tp, inputs: m.py:gqa_inputs,
         mesh: {tp: 4}}
      - {name: gqa-k-from-v, reference: m.py:gqa, distributed: m.py:gqa_tp_k_from_v, inputs: m.py:gqa_inputs,
         mesh: {tp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("kv_heads"), "m.py", MODELS, MANIFEST)


def test_gqa_picking_kv_heads_from_the_projection_verifies(manifest) -> None:
    result = _verify(manifest, "gqa-activation-heads")
    assert result.status is Status.VERIFIED, result.findings


def test_gqa_reading_k_from_the_v_half_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "gqa-k-from-v")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
