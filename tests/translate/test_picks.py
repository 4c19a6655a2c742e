"""A gather of one element per row as the sum against a one-hot (equivci/translate/picks.py).

The fact is stated beside the gather's term when the index is known to lie in the gathered dim;
both members are evaluated here and checked against what XLA computes. Where the fact would be
false (an index that may leave the dim, which a gather clamps and a one-hot zeroes; lanes gathered
across) it is not stated. The end-to-end near misses are tests/soundness (pick-one-hot*)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from one_device import programs

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import GatherDims
from equivci.translate.builder import Builder
from equivci.translate.picks import one_hot_sum

RNG = np.random.default_rng(5)
T, V = 6, 8
IDS = RNG.integers(0, V, (T,)).astype(np.int32)


def _along_last(x, ids):
    return jnp.take_along_axis(x, ids[:, None], axis=-1)[:, 0]


def _batched(x, ids):  # [B, T/B, V] at [B, T/B] ids
    return jnp.take_along_axis(x, ids.reshape(2, T // 2)[..., None], axis=-1)[..., 0]


def _along_first(x, ids):  # the vocabulary leading: [V, T]
    return jnp.take_along_axis(x.T, ids[None, :], axis=0)[0]


def _clipped_previous(x, ids):  # ids - 1 has no known bounds; the clip gives it [0, V)
    return _along_last(x, jnp.clip(ids - 1, 0, V - 1))


def _log_softmax_picked(x, ids):  # a cross-entropy's target term
    return -_along_last(jax.nn.log_softmax(x), ids)


PICKS = {
    "along the last dim": (_along_last, (T, V)),
    "batched rows": (_batched, (2, T // 2, V)),
    "along the first dim": (_along_first, (T, V)),
    "clipped index": (_clipped_previous, (T, V)),
    "log-softmax target": (_log_softmax_picked, (T, V)),
}


def _programs(fn, args):
    built, want, _ = programs(fn, args)
    return built, want


def _one_hot_facts(programs) -> list[list[Term]]:
    """[the gather's term, its one-hot sums (x times the one-hot, and the one-hot times x)] the
    translation stated."""
    return [
        group
        for group in programs.evaluator.equal_terms
        if len(group) == 3 and all(t.op == "reduce" and t.args[0].attrs == ("multiply",) for t in group[1:])
    ]


@pytest.mark.parametrize("case", sorted(PICKS))
def test_a_picked_element_is_the_sum_against_its_one_hot(case):
    fn, shape = PICKS[case]
    x = RNG.standard_normal(shape).astype(np.float32)
    programs, want = _programs(fn, (x, IDS))
    facts = _one_hot_facts(programs)
    assert facts, "the gather's one-hot sum was not stated"
    params, values = {0: x, 1: IDS}, programs.evaluator.values
    for gathered, *sums in facts:
        assert sums[0].args[0].args[::-1] == sums[1].args[0].args, "the one product in both orders"
        for summed in sums:
            np.testing.assert_allclose(evaluate(summed, params, values), evaluate(gathered, params, values), atol=1e-6)
    np.testing.assert_allclose(evaluate(programs.reference_outputs[0], params, values), want, rtol=1e-5, atol=1e-5)


def _raw_next(x, ids):  # no range check: XLA clamps V to column V - 1, a one-hot of V is zeros
    # (not ids - 1: jnp wraps -1 to V - 1 first, and that index is in range, its one-hot sum true)
    return _along_last(x, ids) + jnp.take_along_axis(x, (ids + 1)[:, None], axis=-1, mode="promise_in_bounds")[:, 0]


def _rows(table, ids):  # whole rows, not single elements
    return table[ids]


@pytest.mark.parametrize("fn", [_raw_next, _rows], ids=["index past the dim", "rows of a table"])
def test_only_single_elements_at_a_bounded_column_are_one_hot_sums(fn):
    x = RNG.standard_normal((T, V)).astype(np.float32)
    programs, _ = _programs(fn, (x, IDS))
    stated = [gathered for gathered, *_ in _one_hot_facts(programs)]
    indices = {_unreshaped(gathered.args[1]) for gathered in stated}
    # the in-range take's (in both programs), never the one at ids + 1
    assert indices == ({programs.params[1]} if fn is _raw_next else set())


def _unreshaped(t: Term) -> Term:
    return _unreshaped(t.args[0]) if t.op == "reshape" else t


def test_lanes_gathered_across_stay_a_gather():
    """out[i, j] = x[j, i, idx[i, j]]: the batching dims pair the operand's lanes with the index's
    the other way round, so the one-hot sum over x's own lanes is the transpose, not the gather."""
    ev = Builder(None, TermTable(), 1)  # type: ignore[arg-type]
    x = ev.mk("param", (0,), (), Shape("f32", (3, 3, V)))
    idx = ev.mk("param", (1,), (), Shape("s32", (3, 3)))
    ev.bounds[idx] = (0, V - 1)
    straight = GatherDims((), (2,), (2,), (0, 1), (0, 1), 2, (1, 1, 1))
    across = GatherDims((), (2,), (2,), (0, 1), (1, 0), 2, (1, 1, 1))
    out = Shape("f32", (3, 3))
    assert one_hot_sum(ev, x, idx, straight, out) is not None
    assert one_hot_sum(ev, x, idx, across, out) is None


# -- a dot of weights with the picks of a gather: the weights' one-hot against the gathered rows ---
N, E, K, W = 6, 5, 2, 3  # tokens, experts, picks per token, width


def _top_picks(logits):
    return jax.lax.top_k(logits, K)[1]  # bounded by the top-k: [0, E)


def _gates_first(logits, ys, gates):
    picked = jnp.take_along_axis(ys, _top_picks(logits)[..., None], axis=1)
    return jnp.einsum("nk,nkd->nd", gates, picked)


def _picks_first(logits, ys, gates):
    picked = jnp.take_along_axis(ys, _top_picks(logits)[..., None], axis=1)
    return jnp.einsum("nkd,nk->nd", picked, gates)


def _experts_leading(logits, ys, gates):  # every expert's rows [E, N, W], swapped before the pick
    picked = jnp.take_along_axis(jnp.swapaxes(ys, 0, 1), _top_picks(logits)[..., None], axis=1)
    return jnp.einsum("nk,nkd->nd", gates, picked)


def _clamped_past_the_end(logits, ys, gates):  # an index that may be E: the gather clamps it
    # argsort's ids are in [0, E), so a clip to [0, E] of them alone is no clamp (bounds.unclamped):
    # shifted by one they reach E
    idx = jnp.clip(jnp.argsort(logits)[:, :K] + 1, 0, E)
    picked = jnp.take_along_axis(ys, idx[..., None], axis=1, mode="clip")
    return jnp.einsum("nk,nkd->nd", gates, picked)


WEIGHTED = {"gates first": (_gates_first, (N, E, W)), "picks first": (_picks_first, (N, E, W)),
            "experts leading": (_experts_leading, (E, N, W))}


def _weighted_args(ys_shape):
    return (RNG.standard_normal((N, E)).astype(np.float32), RNG.standard_normal(ys_shape).astype(np.float32),
            RNG.standard_normal((N, K)).astype(np.float32))


def _weighted_groups(built):
    return [g for g in built.evaluator.equal_terms if g[0].op == "dot" and any(t.op == "dot" for t in g[1:])
            and any(a.op == "reduce" for t in g[1:] for a in t.args)]


@pytest.mark.parametrize("name", sorted(WEIGHTED))
def test_weights_times_picks_are_the_weighted_one_hot_against_the_rows(name):
    """sum_k g[n, k] * ys[n, idx[n, k]] = sum_e (sum_k g[n, k] * (idx[n, k] == e)) * ys[n, e], stated
    beside the dot (and the weighted one-hot as a reduce and as a dot), checked against XLA."""
    fn, ys_shape = WEIGHTED[name]
    args = _weighted_args(ys_shape)
    built, want, _ = programs(fn, args)
    params, values = dict(enumerate(args)), built.evaluator.values
    np.testing.assert_allclose(evaluate(built.reference_outputs[0], params, values), want, rtol=1e-5, atol=1e-5)
    assert _weighted_groups(built), "the weighted one-hot was not stated"
    for group in built.evaluator.equal_terms:
        first = evaluate(group[0], params, values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, params, values), first, rtol=1e-5, atol=1e-5)


def test_no_weighted_one_hot_for_an_index_past_the_rows():
    """An index that may be E reads row E - 1 (the gather clamps) where its one-hot is all zeros."""
    built, _, _ = programs(_clamped_past_the_end, _weighted_args((N, E, W)))
    assert not _weighted_groups(built)
