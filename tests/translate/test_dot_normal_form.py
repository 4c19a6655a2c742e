"""One form for a dot whatever the operand order, the operands' transposes and merged contractions
(equivci.translate.relayouts: reoriented, split_contraction; equivci.translate.builder:
transposed_reshape and windows of transposes).

Each fact is checked numerically on the terms the evaluator builds (the normal form against the
dot as written, on random arrays), each guard on a near miss (the rewrite it forbids changes the
value), and on JAX programs in a style unlike the blind jit-partitioned attention: a reference
written with weights-first einsums, a shard_map program with `x @ w.reshape(d, -1)`, heads merged
before the output projection, and near misses (heads merged without moving them back, the output
weight flattened in the other order, the scores contracting over the wrong dim or with their free dims swapped).
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify
from test_dot_relayouts import _dot_inst

from equivci.hlo.ir import Instruction, Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import parse_transpose, transpose_text
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot
from equivci.translate.shapes import transpose

RNG = np.random.default_rng(0)


def _values(*shapes):
    return {k: RNG.standard_normal(shape) for k, shape in enumerate(shapes)}


def _transpose_inst(out: tuple[int, ...], perm: tuple[int, ...]) -> Instruction:
    return Instruction(
        "t", "transpose", Shape("f32", out), ("a",), {"dimensions": "{" + ",".join(map(str, perm)) + "}"}
    )


def _xw(ev):
    """w [d, f] (input 0) and x [b, s, d] (input 1), and the projection written both ways:
    x @ w [b, s, f] and einsum("df,bsd->fbs", w, x)."""
    w = ev.table.make("param", (0,), (), (8, 5), "f32")
    x = ev.table.make("param", (1,), (), (2, 3, 8), "f32")
    xw = dot(ev, _dot_inst((2, 3, 5), "{2}", "{0}"), [x, w], 0)
    wx = dot(ev, _dot_inst((5, 2, 3), "{0}", "{2}"), [w, x], 0)
    return w, x, xw, wx


def test_a_dot_keeps_its_written_order_until_a_dot_reads_it() -> None:
    ev = Evaluator(None, TermTable(), 1)
    w, x, xw, wx = _xw(ev)
    assert (xw.op, xw.args) == ("dot", (x, w)) and (wx.op, wx.args) == ("dot", (w, x))


def test_a_dot_reading_a_dot_reads_it_in_one_operand_order() -> None:
    # scores of the projection with itself, written from x @ w and from the weights-first einsum:
    # einsum("bsf,btf->bst") of x @ w, and the same of transpose(einsum("df,bsd->fbs", w, x))
    ev = Evaluator(None, TermTable(), 1)
    w, x, xw, wx = _xw(ev)
    from_xw = dot(ev, _dot_inst((2, 3, 3), "{2}", "{2}", "{0}", "{0}"), [xw, xw], 0)
    moved = ev.mk("transpose", (transpose_text((1, 2, 0)),), [wx], Shape("f32", (2, 3, 5)))
    from_wx = dot(ev, _dot_inst((2, 3, 3), "{2}", "{2}", "{0}", "{0}"), [moved, moved], 0)
    assert from_xw is from_wx
    assert from_xw.op == "dot" and from_xw.args == (xw, xw)  # the higher-numbered input first: x
    values = _values((8, 5), (2, 3, 8))
    projected = values[1] @ values[0]
    np.testing.assert_allclose(evaluate(from_xw, values), np.einsum("bsf,btf->bst", projected, projected), rtol=1e-6)


def test_a_transposed_dot_keeps_its_written_order() -> None:
    # Only a dot reads a dot in one order: a transpose keeps the written one, since a device's unit
    # head dim can make the transpose of the one order a plain reshape where the reference's several
    # heads keep it (test_window_of_reshaped_window's GQA); the dot reading the transpose absorbs it.
    ev = Evaluator(None, TermTable(), 1)
    w, x, xw, wx = _xw(ev)
    t = transpose(ev, _transpose_inst((3, 2, 5), (2, 1, 0)), [wx], 0)  # [s, b, f] from the einsum
    assert t.op == "transpose" and t.args[0] is wx
    values = _values((8, 5), (2, 3, 8))
    np.testing.assert_allclose(evaluate(t, values), (values[1] @ values[0]).transpose(1, 0, 2), rtol=1e-6)


def test_windows_of_a_dot_read_in_the_other_order_move_with_its_dims() -> None:
    # a head window of the weights-first einsum, transposed and contracted: the window is taken of x @ w
    ev = Evaluator(None, TermTable(), 1)
    w, x, xw, wx = _xw(ev)
    u = ev.table.make("param", (2,), (), (3, 4), "f32")
    window = ev.slice_term(wx, 0, 1, 4)  # [3, b, s]
    moved = transpose(ev, _transpose_inst((2, 3, 3), (1, 2, 0)), [window], 0)  # [b, s, 3]
    out = dot(ev, _dot_inst((2, 3, 4), "{2}", "{0}"), [moved, u], 0)
    assert out.op == "dot" and out.args == (ev.slice_term(xw, 2, 1, 4), u)
    values = _values((8, 5), (2, 3, 8), (3, 4))
    expected = (values[1] @ values[0])[:, :, 1:4] @ values[2]
    np.testing.assert_allclose(evaluate(out, values), expected, rtol=1e-6)


def test_a_dot_read_by_a_dot_has_its_batch_pairs_in_the_lhs_order() -> None:
    # einsum("hbgqs,gbhsk->bghqk"): batch pairs (b, g, h) written in another order than the lhs's
    ev = Evaluator(None, TermTable(), 1)
    p = ev.table.make("param", (1,), (), (2, 3, 4, 5, 6), "f32")  # [h, b, g, q, s]
    v = ev.table.make("param", (0,), (), (4, 3, 2, 6, 7), "f32")  # [g, b, h, s, k]
    u = ev.table.make("param", (2,), (), (7,), "f32")
    ctx = dot(ev, _dot_inst((3, 4, 2, 5, 7), "{4}", "{3}", "{1,2,0}", "{1,0,2}"), [p, v], 0)
    assert ctx.op == "dot"  # its own term as written
    summed = dot(ev, _dot_inst((3, 4, 2, 5), "{4}", "{0}"), [ctx, u], 0)  # [b, g, h, q]
    assert summed.op == "transpose" and summed.args[0].op == "dot"  # transpose(dot(ctx in one form, u))
    inner = summed.args[0].args[0]
    assert inner.op == "dot" and inner.attrs[0].startswith("0,1,2|2,1,0|") and inner.args == (p, v)
    assert inner.shape == (2, 3, 4, 5, 7)  # [h, b, g, q, k]: each batch pair took its output dim along
    values = _values((4, 3, 2, 6, 7), (2, 3, 4, 5, 6), (7,))
    expected = np.einsum("hbgqs,gbhsk,k->bghq", values[1], values[0], values[2])
    np.testing.assert_allclose(evaluate(summed, values), expected, rtol=1e-5)


def test_operands_that_read_the_same_inputs_keep_the_written_order() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (3, 8), "f32")
    ex = ev.mk("unary", ("exponential",), [x], Shape("f32", (3, 8)))
    xx = dot(ev, _dot_inst((3, 3), "{1}", "{1}"), [ex, x], 0)
    summed = dot(ev, _dot_inst((3, 3), "{0}", "{0}"), [xx, xx], 0)
    assert summed.op == "dot" and summed.args == (xx, xx)
    value = RNG.standard_normal((3, 8))
    expected = np.exp(value) @ value.T
    np.testing.assert_allclose(evaluate(summed, {0: value}), expected.T @ expected, rtol=1e-6)


def test_a_window_of_a_transpose_is_a_transpose_of_the_window() -> None:
    ev = Evaluator(None, TermTable(), 1)
    y = ev.table.make("param", (0,), (), (2, 3, 4), "f32")
    moved = ev.mk("transpose", (transpose_text((2, 0, 1)),), [y], Shape("f32", (4, 2, 3)))
    window = ev.slice_term(moved, 0, 1, 3)
    assert window.op == "transpose" and window.args[0].op == "slice" and window.args[0].attrs == (2, 1, 3)
    value = RNG.standard_normal((2, 3, 4))
    np.testing.assert_allclose(evaluate(window, {0: value}), value.transpose(2, 0, 1)[1:3], rtol=1e-6)


def _reshape_of_transpose(perm, y_shape, out):
    ev = Evaluator(None, TermTable(), 1)
    y = ev.table.make("param", (0,), (), y_shape, "f32")
    moved = tuple(y_shape[k] for k in perm)
    t = ev.mk("transpose", (transpose_text(perm),), [y], Shape("f32", moved))
    return ev.reshape_term(t, Shape("f32", out)), y


@pytest.mark.parametrize(
    "perm, y_shape, out",
    [
        ((1, 2, 0), (8, 2, 6), (2, 6, 2, 4)),  # the split dim moves out whole
        ((0, 3, 1, 2), (2, 3, 4, 5), (2, 5, 12)),  # merges dims consecutive in y
        ((2, 0, 1), (4, 3, 5), (5, 1, 12)),  # a size-1 dim added
    ],
)
def test_a_reshape_of_a_transpose_along_runs_is_a_transpose_of_a_reshape(perm, y_shape, out) -> None:
    term, y = _reshape_of_transpose(perm, y_shape, out)
    assert term.op == "transpose" and term.args[0].op == "reshape" and term.args[0].args[0] is y
    assert tuple(term.args[0].shape[k] for k in parse_transpose(term.attrs[0])) == out  # the transpose fits
    value = RNG.standard_normal(y_shape)
    np.testing.assert_allclose(evaluate(term, {0: value}), value.transpose(perm).reshape(out), rtol=1e-6)


def test_a_reshape_merging_dims_out_of_order_stays_a_reshape() -> None:
    # [b, s, h, k] from y [b, h, k, s]... merged (s, h): y's dims 3 and 1, not a run
    term, y = _reshape_of_transpose((0, 3, 1, 2), (2, 3, 4, 5), (2, 15, 4))
    assert term.op == "reshape" and term.args[0].op == "transpose"
    value = RNG.standard_normal((2, 3, 4, 5))
    expected = value.transpose(0, 3, 1, 2).reshape(2, 15, 4)
    np.testing.assert_allclose(evaluate(term, {0: value}), expected, rtol=1e-6)
    # the guard matters: merging y's dims in their own order is another value
    assert not np.allclose(value.reshape(2, 3, 20).transpose(0, 2, 1).reshape(2, 15, 4), expected)


def _flat_contraction(o_sizes, w_sizes):
    """o [b, h, k] and w [h', k', m] (shapes per the sizes) each flattened over their first two
    contracted dims, then contracted: the dot as built and the two flattened operands."""
    ev = Evaluator(None, TermTable(), 1)
    o = ev.table.make("param", (0,), (), (2, *o_sizes), "f32")
    w = ev.table.make("param", (1,), (), (*w_sizes, 5), "f32")
    of = ev.reshape_term(o, Shape("f32", (2, int(np.prod(o_sizes)))))
    wf = ev.reshape_term(w, Shape("f32", (int(np.prod(w_sizes)), 5)))
    return dot(ev, _dot_inst((2, 5), "{1}", "{0}"), [of, wf], 0), o, w


def test_a_contraction_both_sides_merged_alike_is_a_dot_over_the_split_dims() -> None:
    term, o, w = _flat_contraction((3, 4), (3, 4))
    assert term.op == "dot" and term.args == (o, w)
    values = _values((2, 3, 4), (3, 4, 5))
    np.testing.assert_allclose(evaluate(term, values), np.einsum("bhk,hkm->bm", *values.values()), rtol=1e-6)


def test_a_contraction_merged_from_other_sizes_is_not_split() -> None:
    term, o, w = _flat_contraction((3, 4), (4, 3))
    assert not (term.op == "dot" and term.args == (o, w))
    values = _values((2, 3, 4), (4, 3, 5))
    expected = values[0].reshape(2, 12) @ values[1].reshape(12, 5)
    np.testing.assert_allclose(evaluate(term, values), expected, rtol=1e-6)
    # the guard matters: pairing the split dims by their sizes is another value
    assert not np.allclose(np.einsum("bhk,khm->bm", values[0], values[1]), expected)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, H, K = 2, 4, 8, 4, 4


    def inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((D, H, K), f32), jax.ShapeDtypeStruct((D, H, K), f32),
                jax.ShapeDtypeStruct((D, H, K), f32), jax.ShapeDtypeStruct((H, K, D), f32),
                jax.ShapeDtypeStruct((B, S, D), f32))


    def attn(wq, wk, wv, wo, x):
        q = jnp.einsum("dhk,bsd->hkbs", wq, x)
        k = jnp.einsum("dhk,bsd->hkbs", wk, x)
        v = jnp.einsum("dhk,bsd->hkbs", wv, x)
        p = jax.nn.softmax(jnp.einsum("hkbs,hkbt->bhst", q, k), axis=-1)
        ctx = jnp.einsum("hkbt,bhst->hkbs", v, p)
        return jnp.einsum("hkd,hkbs->bsd", wo, ctx)


    def _attn_tp(wq, wk, wv, wo, x, mesh, merge, flat_wo, scores):
        def body(wq, wk, wv, wo, x):
            h = wq.shape[1]
            q, k, v = ((x @ w.reshape(D, h * K)).reshape(B, S, h, K).transpose(0, 2, 1, 3) for w in (wq, wk, wv))
            p = jax.nn.softmax(scores(q, k), axis=-1)
            return lax.psum(merge(p @ v, h) @ flat_wo(wo, h), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp"), P()),
                             out_specs=P())(wq, wk, wv, wo, x)


    def _merge(o, h):
        return o.transpose(0, 2, 1, 3).reshape(B, S, h * K)


    def _flat(wo, h):
        return wo.reshape(h * K, D)


    def _scores(q, k):
        return q @ k.transpose(0, 1, 3, 2)


    def attn_tp(wq, wk, wv, wo, x, *, mesh):
        return _attn_tp(wq, wk, wv, wo, x, mesh, _merge, _flat, _scores)


    def attn_tp_merge_unmoved(wq, wk, wv, wo, x, *, mesh):
        return _attn_tp(wq, wk, wv, wo, x, mesh, lambda o, h: o.reshape(B, S, h * K), _flat, _scores)


    def attn_tp_wo_other_order(wq, wk, wv, wo, x, *, mesh):
        return _attn_tp(wq, wk, wv, wo, x, mesh, _merge, lambda wo, h: wo.transpose(1, 0, 2).reshape(h * K, D), _scores)


    def attn_tp_scores_over_seq(wq, wk, wv, wo, x, *, mesh):  # S == K: contracts the positions
        return _attn_tp(wq, wk, wv, wo, x, mesh, _merge, _flat, lambda q, k: q.transpose(0, 1, 3, 2) @ k)


    def attn_tp_scores_swapped(wq, wk, wv, wo, x, *, mesh):  # the free dims the other way round
        return _attn_tp(wq, wk, wv, wo, x, mesh, _merge, _flat, lambda q, k: k @ q.transpose(0, 1, 3, 2))
    """
)

NAMES = {
    "heads-merged": "attn_tp",
    "merge-unmoved": "attn_tp_merge_unmoved",
    "wo-other-order": "attn_tp_wo_other_order",
    "scores-over-seq": "attn_tp_scores_over_seq",
    "scores-swapped": "attn_tp_scores_swapped",
}
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: m.py:attn, distributed: m.py:{fn}, inputs: m.py:inputs, mesh: {{tp: 2}}}}\n"
    for name, fn in NAMES.items()
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("dot_form"), "m.py", MODELS, MANIFEST)


def test_attention_written_weights_first_and_activations_first_verifies(manifest) -> None:
    result = _verify(manifest, "heads-merged")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["merge-unmoved", "wo-other-order", "scores-over-seq", "scores-swapped"])
def test_near_misses_of_the_dot_form_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
