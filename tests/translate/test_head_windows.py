"""Heads sharded inside a fused weight or inside a KV group: a device's heads are a window of the
reference's along two dims of a head split, and a projection written weights-first is the
reference's written activations-first.

The facts (each checked numerically here, the rules also in tests/terms/test_rules_numeric.py):
- a transpose of windows of dot(w, x) is the same windows of dot(x, w) (the loader states it:
  equivci.terms.load.Loader._swapped_windows): a device's gate and up halves of
  einsum("bsd,dtf->tbsf") moved back to [b, s, f] are windows of the reference's x @ w;
- a dot reading heads split off a projection (a reshape that splits a dim into several heads,
  under windows) reads the projection in one operand order (relayouts.reoriented), so that
  einsum("bsd,dthe->tbshe") on a device and `jnp.split(x @ w, 3)` heads in the reference meet;
  a reshape that only inserts or drops a device's one head is not followed (the reference's
  several heads, repeated per KV group, keep the written order);
- a size-1 dim a reshape inserts before a split leads that split when the reshape moves out of a
  transpose (Builder.transposed_reshape): a device's [b, s, 1, 2, hd] is one group of the
  reference's [b, s, groups, heads, hd];
- m of a group's M heads, split as [1, m, hd], are the window [g:g+1][h:h+m] of the [G, M, hd]
  split, and merged back, a window of the merge (layouts/reshape_lift_in_group,
  layouts/reshape_merge_in_group).

On JAX programs in styles unlike the blind Megatron block and the SDPA GQA: a fused QKV weight viewed
[D, 3, H, HD] on each device with an einsum, against a reference that splits the flat projection;
grouped-query attention written with einsums over [b, s, groups, heads, hd], a device holding two
heads of one group. Near misses: the fused weight viewed heads-major (the heads taken on the wrong
factor), the heads merged head_dim-major, and the KV group picked in tile order.
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
from equivci.terms.ir import TermTable
from equivci.terms.load import Loader
from equivci.terms.semantics import evaluate
from equivci.terms.spec import transpose_text
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot

RNG = np.random.default_rng(0)


def _projections(ev):
    """w [d, f] (input 1, read first in the one form), x [b, s, d] (input 0), x @ w [b, s, f] and
    einsum("df,bsd->fbs", w, x) [f, b, s]."""
    x = ev.table.make("param", (0,), (), (2, 3, 8), "f32")
    w = ev.table.make("param", (1,), (), (8, 12), "f32")
    xw = dot(ev, _dot_inst((2, 3, 12), "{2}", "{0}"), [x, w], 0)
    wx = dot(ev, _dot_inst((12, 2, 3), "{0}", "{2}"), [w, x], 0)
    return x, w, xw, wx


def _values():
    return {0: RNG.standard_normal((2, 3, 8)), 1: RNG.standard_normal((8, 12))}


def _proved(a, b) -> bool:
    egraph = EGraph()
    loader = Loader(egraph)
    ea, eb = loader.expr(a), loader.expr(b)
    loader.flush()
    _run(egraph, 6)
    return proved_equal(egraph, ea, eb)


def test_a_transpose_of_windows_of_a_dot_is_the_windows_of_the_swapped_dot() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x, w, xw, wx = _projections(ev)
    half = ev.mk("slice", (0, 6, 12), [wx], Shape("f32", (6, 2, 3)))  # the up half, [f, b, s]
    moved = ev.mk("transpose", (transpose_text((1, 2, 0)),), [half], Shape("f32", (2, 3, 6)))
    window = ev.slice_term(xw, 2, 6, 12)
    values = _values()
    np.testing.assert_allclose(evaluate(moved, values), evaluate(window, values), rtol=1e-6)
    assert _proved(moved, window)
    # the windows move with the dims: the other half is another value
    other = ev.slice_term(xw, 2, 0, 6)
    assert not np.allclose(evaluate(moved, values), evaluate(other, values))
    assert not _proved(moved, other)


def _scores(ev, proj, split):
    """Heads [0, 2) of a projection split as `split`, contracted with themselves over head_dim."""
    q = ev.reshape_term(ev.slice_term(proj, *split[0]), Shape("f32", split[1]))
    return q, dot(ev, _dot_inst(split[2], "{3}", "{3}", "{0,2}", "{0,2}"), [q, q], 0)


def test_heads_split_off_a_projection_are_read_in_one_operand_order() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x, w, xw, wx = _projections(ev)
    # q = (x @ w)[..., :8].reshape(b, s, 2, 4) in the reference, einsum("df,bsd->fbs")[:8] split
    # as [2, 4, b, s] and moved to [b, s, 2, 4] on a device: both read the weights-first dot
    _, from_xw = _scores(ev, xw, ((2, 0, 8), (2, 3, 2, 4), (2, 2, 3, 3)))
    heads = ev.reshape_term(ev.slice_term(wx, 0, 0, 8), Shape("f32", (2, 4, 2, 3)))
    moved = ev.mk("transpose", (transpose_text((2, 3, 0, 1)),), [heads], Shape("f32", (2, 3, 2, 4)))
    from_wx = dot(ev, _dot_inst((2, 2, 3, 3), "{3}", "{3}", "{0,2}", "{0,2}"), [moved, moved], 0)
    assert from_xw is from_wx
    values = _values()
    q = (values[0] @ values[1])[..., :8].reshape(2, 3, 2, 4)
    np.testing.assert_allclose(evaluate(from_xw, values), np.einsum("bshe,bthe->bhst", q, q), rtol=1e-6)


def test_a_projection_with_one_head_inserted_keeps_its_written_order() -> None:
    # [b, s, 1, 4]: a device's one head; only a split into several heads is followed
    ev = Evaluator(None, TermTable(), 1)
    x, w, xw, wx = _projections(ev)
    q, scores = _scores(ev, xw, ((2, 0, 4), (2, 3, 1, 4), (2, 1, 3, 3)))
    assert scores.op == "dot" and scores.args == (q, q) and q.args[0].args[0] is xw


def test_a_unit_dim_before_a_split_leads_it_out_of_a_transpose() -> None:
    # y [8, 2, 3] (heads x head_dim, b, s) moved to [b, s, 8], viewed [b, s, 1, 2, 4]
    ev = Evaluator(None, TermTable(), 1)
    y = ev.table.make("param", (0,), (), (8, 2, 3), "f32")
    moved = ev.mk("transpose", (transpose_text((1, 2, 0)),), [y], Shape("f32", (2, 3, 8)))
    term = ev.reshape_term(moved, Shape("f32", (2, 3, 1, 2, 4)))
    assert term.op == "transpose" and term.args[0].op == "reshape" and term.args[0].shape == (1, 2, 4, 2, 3)
    value = RNG.standard_normal((8, 2, 3))
    np.testing.assert_allclose(evaluate(term, {0: value}), value.transpose(1, 2, 0).reshape(2, 3, 1, 2, 4))


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, H, HD = 2, 4, 16, 4, 4
    NQ, NKV = 8, 2


    def fused_inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((D, 3 * H * HD), f32),
                jax.ShapeDtypeStruct((H * HD, D), f32))


    def _attend(q, k, v):
        s = jnp.einsum("bqhe,bkhe->bhqk", q, k)
        return jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)


    def fused(x, w, wo):  # columns [q | k | v], each [heads, head_dim]
        q, k, v = (t.reshape(B, S, H, HD) for t in jnp.split(x @ w, 3, axis=-1))
        return _attend(q, k, v).reshape(B, S, H * HD) @ wo


    def _tp(x, w, wo, mesh, layout, spec, equation, merge=lambda o: o.reshape(B, S, -1)):
        def body(x, w, wo):
            q, k, v = jnp.einsum(equation, x, w)
            return lax.psum(merge(_attend(q, k, v)) @ wo, "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), spec, P("tp", None)), out_specs=P())(
            x, w.reshape(layout), wo)


    def fused_tp(x, w, wo, *, mesh):  # the weight viewed [D, 3, H, HD], sharded on H
        return _tp(x, w, wo, mesh, (D, 3, H, HD), P(None, None, "tp", None), "bsd,dthe->tbshe")


    def fused_wrong_factor_tp(x, w, wo, *, mesh):  # viewed [D, H, 3, HD]: q, k, v interleaved per head
        return _tp(x, w, wo, mesh, (D, H, 3, HD), P(None, "tp", None, None), "bsd,dhte->tbshe")  # MARK:factor


    def fused_merge_swapped_tp(x, w, wo, *, mesh):  # the heads merged head_dim-major
        return _tp(x, w, wo, mesh, (D, 3, H, HD), P(None, None, "tp", None), "bsd,dthe->tbshe",
                   merge=lambda o: o.swapaxes(2, 3).reshape(B, S, -1))  # MARK:merge


    def gqa_inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((D, NQ * HD), f32),
                jax.ShapeDtypeStruct((D, NKV * HD), f32), jax.ShapeDtypeStruct((D, NKV * HD), f32),
                jax.ShapeDtypeStruct((NQ * HD, D), f32))


    def _grouped(q, k, v):  # q [b, s, groups, heads per group, hd], k and v [b, s, groups, hd]
        s = jnp.einsum("bqgne,bkge->bgnqk", q, k)
        return jnp.einsum("bgnqk,bkge->bqgne", jax.nn.softmax(s, axis=-1), v)


    def gqa(x, wq, wk, wv, wo):
        q = (x @ wq).reshape(B, S, NKV, NQ // NKV, HD)
        k, v = ((x @ w).reshape(B, S, NKV, HD) for w in (wk, wv))
        return _grouped(q, k, v).reshape(B, S, NQ * HD) @ wo


    def _gqa_tp(x, wq, wk, wv, wo, mesh, group_of):
        def body(x, wq, wk, wv, wo):
            g = group_of(lax.axis_index("tp"))
            q = (x @ wq).reshape(B, S, 1, -1, HD)
            k, v = (lax.dynamic_slice_in_dim((x @ w).reshape(B, S, NKV, HD), g, 1, axis=2) for w in (wk, wv))
            return lax.psum(_grouped(q, k, v).reshape(B, S, -1) @ wo, "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P(), P(), P("tp", None)),
                             out_specs=P())(x, wq, wk, wv, wo)


    def gqa_tp(x, wq, wk, wv, wo, *, mesh):  # 4 devices, 2 of a group's 4 heads each
        return _gqa_tp(x, wq, wk, wv, wo, mesh, lambda i: i // 2)


    def gqa_tile_order_tp(x, wq, wk, wv, wo, *, mesh):  # the group of device i taken as i % 2
        return _gqa_tp(x, wq, wk, wv, wo, mesh, lambda i: i % 2)  # MARK:tile
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: fused, reference: m.py:fused, distributed: m.py:fused_tp, inputs: m.py:fused_inputs, mesh: {tp: 2}}
      - {name: fused-wrong-factor, reference: m.py:fused, distributed: m.py:fused_wrong_factor_tp,
         inputs: m.py:fused_inputs, mesh: {tp: 2}}
      - {name: fused-merge-swapped, reference: m.py:fused, distributed: m.py:fused_merge_swapped_tp,
         inputs: m.py:fused_inputs, mesh: {tp: 2}}
      - {name: gqa-grouped, reference: m.py:gqa, distributed: m.py:gqa_tp, inputs: m.py:gqa_inputs, mesh: {tp: 4}}
      - {name: gqa-grouped-tile-order, reference: m.py:gqa, distributed: m.py:gqa_tile_order_tp,
         inputs: m.py:gqa_inputs, mesh: {tp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("head_windows"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["fused", "gqa-grouped"])
def test_heads_inside_a_fused_weight_or_a_kv_group_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["fused-wrong-factor", "fused-merge-swapped", "gqa-grouped-tile-order"])
def test_near_misses_of_head_windows_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
