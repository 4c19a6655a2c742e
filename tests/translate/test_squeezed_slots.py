"""A slot of a fused projection laid out slot-major, `qkv[0]` of einsum("bsd,dthk->tbshk"), is a
squeezed window of the dot with its operands swapped: transpose(squeeze(windows of dot(w, x)))
is the squeeze of the same windows of dot(x, w), transposed once more where that dot lays the
kept dims out in another order than the transpose's (equivci.terms.load.Loader._swapped_squeeze; a
squeeze moves no element). A device that projects its own slot and heads, x @ w[:, 0], computes a
window of it.

Checked numerically on the terms the evaluator builds, in the e-graph against near misses (the
next slot, the heads and head_dim swapped), and on JAX programs in two styles: slots indexed out of
the slot-major einsum, and slots sliced out of a tensordot laid out [b, s, slot, h, k]; near
misses read k from the v slot, and q from the k slot.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from egglog import EGraph
from model_package import verify_named as _verify
from test_dot_relayouts import _dot_inst

from equivci.hlo.ir import Shape
from equivci.prove.saturate import _run, proved_equal
from equivci.results import Status
from equivci.terms.ir import Term, TermTable
from equivci.terms.load import Loader
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot

RNG = np.random.default_rng(0)
B, S, D, H, K = 2, 3, 8, 4, 4  # heads and head_dim of one size: swapping them is a near miss


def _slot(ev: Evaluator, x: Term, w: Term, slot: int, perm: tuple[int, ...]) -> Term:
    """einsum("bsd,dthk->tbshk", x, w)[slot] moved by `perm` from [b, s, h, k], as the evaluator
    builds it (the dot reads w first, the inputs' one form)."""
    projection = dot(ev, _dot_inst((3, H, K, B, S), "{0}", "{2}"), [w, x], 0)
    moved = ev.transpose_term(projection, (0, 3, 4, 1, 2))
    squeezed = ev.reshape_term(ev.slice_term(moved, 0, slot, slot + 1), Shape("f32", (B, S, H, K)))
    return squeezed if perm == (0, 1, 2, 3) else ev.transpose_term(squeezed, perm)


def _proved(a: Term, b: Term) -> bool:
    egraph = EGraph()
    loader = Loader(egraph)
    ea, eb = loader.expr(a), loader.expr(b)
    loader.flush()
    _run(egraph, 10)
    return proved_equal(egraph, ea, eb)


def test_a_squeezed_slot_of_a_transposed_projection_is_a_window_of_the_swapped_dot() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (B, S, D), "f32")
    w = ev.table.make("param", (1,), (), (D, 3, H, K), "f32")
    reference = _slot(ev, x, w, 0, (0, 1, 2, 3))
    assert reference.op == "transpose" and reference.args[0].op == "reshape"  # the squeeze under it
    # a device's slot 0 and heads [0, 2): x @ w[:, 0, :2] written activations-first
    local = ev.reshape_term(ev.slice_term(ev.slice_term(w, 1, 0, 1), 2, 0, 2), Shape("f32", (D, 2, K)))
    device = dot(ev, _dot_inst((B, S, 2, K), "{2}", "{0}"), [x, local], 0)
    window = ev.table.make("slice", (2, 0, 2), (reference,), (B, S, 2, K), "f32")
    values = {0: RNG.standard_normal((B, S, D)), 1: RNG.standard_normal((D, 3, H, K))}
    expected = np.einsum("bsd,dhk->bshk", values[0], values[1][:, 0, :2])
    np.testing.assert_allclose(evaluate(device, values), expected, rtol=1e-6)
    np.testing.assert_allclose(evaluate(window, values), expected, rtol=1e-6)
    assert _proved(device, window)
    # the next slot, or heads and head_dim swapped, is another value
    next_slot = ev.table.make("slice", (2, 0, 2), (_slot(ev, x, w, 1, (0, 1, 2, 3)),), (B, S, 2, K), "f32")
    swapped = ev.table.make("slice", (2, 0, 2), (_slot(ev, x, w, 0, (0, 1, 3, 2)),), (B, S, 2, K), "f32")
    for wrong in (next_slot, swapped):
        assert not np.allclose(evaluate(wrong, values), expected)
        assert not _proved(device, wrong)


def test_a_transpose_out_of_the_swapped_dots_order_is_stated_with_the_rest_of_the_transpose() -> None:
    # heads and head_dim swapped by the transpose: the swapped dot lays them out [h, k], so the
    # squeeze of its window is transposed once more ([b, s, k, h]), never stated as the squeeze alone
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (B, S, D), "f32")
    w = ev.table.make("param", (1,), (), (D, 3, H, K), "f32")
    swapped = _slot(ev, x, w, 0, (0, 1, 3, 2))
    values = {0: RNG.standard_normal((B, S, D)), 1: RNG.standard_normal((D, 3, H, K))}
    expected = np.einsum("bsd,dhk->bskh", values[0], values[1][:, 0])
    np.testing.assert_allclose(evaluate(swapped, values), expected, rtol=1e-6)
    plain = dot(ev, _dot_inst((B, S, 3, H, K), "{2}", "{0}"), [x, w], 0)  # x @ w, laid out [b, s, slot, h, k]
    squeezed = ev.reshape_term(ev.slice_term(plain, 2, 0, 1), Shape("f32", (B, S, H, K)))
    stated = ev.table.make("transpose", ("0,1,3,2",), (squeezed,), (B, S, K, H), "f32")
    np.testing.assert_allclose(evaluate(stated, values), expected, rtol=1e-6)
    assert _proved(swapped, stated)
    assert not np.allclose(evaluate(squeezed, values), expected)  # (H = K: the shapes agree)
    assert not _proved(swapped, squeezed)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, H, K = 2, 4, 16, 4, 4


    def inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((D, 3, H, K), f32),
                jax.ShapeDtypeStruct((H, K, D), f32))


    def _attend(q, k, v, wo):
        probs = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) * K ** -0.5, axis=-1)
        return jnp.einsum("bqhk,hkd->bqd", jnp.einsum("bhqs,bshk->bqhk", probs, v), wo)


    def attention(x, w, wo):
        qkv = jnp.einsum("bsd,dthk->tbshk", x, w)
        return _attend(qkv[0], qkv[1], qkv[2], wo)


    def _tp(x, w, wo, mesh, local):
        def body(x, w, wo):
            return lax.psum(_attend(*local(x, w), wo), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, None, "tp"), P("tp")), out_specs=P())(
            x, w, wo)


    def _per_slot(slots):
        return lambda x, w: [jnp.einsum("bsd,dhk->bshk", x, w[:, t]) for t in slots]


    def per_slot_tp(x, w, wo, *, mesh):
        return _tp(x, w, wo, mesh, _per_slot((0, 1, 2)))


    def k_from_v_tp(x, w, wo, *, mesh):
        return _tp(x, w, wo, mesh, _per_slot((0, 2, 2)))  # MARK:k_from_v


    def q_from_k_tp(x, w, wo, *, mesh):
        return _tp(x, w, wo, mesh, _per_slot((1, 1, 2)))  # MARK:q_from_k


    def tensordot_tp(x, w, wo, *, mesh):  # [b, s, slot, h, k], the slots sliced out
        def local(x, w):
            qkv = jnp.tensordot(x, w, axes=[[2], [0]])
            return [qkv[:, :, t] for t in range(3)]

        return _tp(x, w, wo, mesh, local)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: per-slot, reference: m.py:attention, distributed: m.py:per_slot_tp, inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: tensordot, reference: m.py:attention, distributed: m.py:tensordot_tp, inputs: m.py:inputs,
         mesh: {tp: 2}}
      - {name: k-from-v, reference: m.py:attention, distributed: m.py:k_from_v_tp, inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: q-from-k, reference: m.py:attention, distributed: m.py:q_from_k_tp, inputs: m.py:inputs, mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("squeezed_slots"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["per-slot", "tensordot"])
def test_slots_of_a_slot_major_projection_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["k-from-v", "q-from-k"])
def test_near_misses_of_slots_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
