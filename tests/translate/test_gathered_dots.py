"""A dot of a token's gathered expert kernels as the gather of the dense per-expert dot
(equivci/translate/gathered_dots.py), and top-k choices added one by one as the dot over the
choices (equivci/translate/unrolled_picks.py).

Every group of terms the translation states equal is evaluated here and must agree, and the
output against what XLA computes for the same HLO; the facts must be stated for each style a
reference writes a gathered MoE in, and not where they would be false (lanes contracted, a lane
left free, choices counted twice or left out, an index window that does not follow its weight's).
The end-to-end near misses are tests/soundness (gathered-moe-*)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from one_device import programs

from equivci.hlo.parser import parse_module
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.translate import gathered_dots
from equivci.translate.evaluator import Evaluator
from equivci.translate.programs import Programs

RNG = np.random.default_rng(13)
T, D, F, E, K = 6, 4, 5, 4, 2


SHAPES = {"router": (D, E), "w1": (E, D, F), "v1": (E, D, F), "w2": (E, F, D), "x": (T, D), "v": (E, D)}


def _args(fn) -> list[np.ndarray]:
    """Random values of fn's parameters, by name (a parameter jit finds unused is pruned from the
    HLO, so each function takes only the inputs it reads)."""
    names = inspect.signature(fn).parameters
    return [RNG.standard_normal(SHAPES[name]).astype(np.float32) for name in names]


def _route(router, x):
    top_p, idx = lax.top_k(jax.nn.softmax(x @ router, axis=-1), K)
    return top_p / jnp.sum(top_p, axis=-1, keepdims=True), idx


def _einsum_loop(router, w1, v1, w2, x):  # DBRX's reference: kernels gathered per choice
    gates, idx = _route(router, x)
    out = jnp.zeros_like(x)
    for j in range(K):
        e = idx[:, j]
        h = jax.nn.silu(jnp.einsum("td,tdf->tf", x, w1[e])) * jnp.einsum("td,tdf->tf", x, v1[e])
        out = out + gates[:, j : j + 1] * jnp.einsum("tf,tfd->td", h, w2[e])
    return out


def _take_vmap(router, w1, w2, x):  # jnp.take and a vmapped row product, summed in reverse
    gates, idx = _route(router, x)
    rows = jax.vmap(lambda row, kernel: row @ kernel)
    out = 0.0
    for j in reversed(range(K)):
        e = idx[:, j]
        h = jax.nn.gelu(rows(x, jnp.take(w1, e, axis=0)))
        out = rows(h, jnp.take(w2, e, axis=0)) * gates[:, j][:, None] + out
    return out


def _take_along_axis(router, w1, w2, x):  # the kernels taken along the expert axis, matmul'ed per row
    gates, idx = _route(router, x)
    out = jnp.zeros_like(x)
    for j in range(K):
        at = idx[:, j][:, None, None]
        h = jax.nn.relu(jnp.einsum("td,tdf->tf", x, jnp.take_along_axis(w1, at, axis=0)))
        out = out + gates[:, j : j + 1] * jnp.einsum("tf,tfd->td", h, jnp.take_along_axis(w2, at, axis=0))
    return out


STYLES = {"einsum loop": _einsum_loop, "take and vmap": _take_vmap, "take_along_axis": _take_along_axis}


def _checked(fn) -> Programs:
    """fn's programs, every stated group of equal terms evaluated alike and the output XLA's."""
    args = _args(fn)
    built, want, _ = programs(fn, args)
    params, values = dict(enumerate(args)), built.evaluator.values
    for group in built.evaluator.equal_terms:
        first = evaluate(group[0], params, values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, params, values), first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(evaluate(built.reference_outputs[0], params, values), want, rtol=1e-5, atol=1e-5)
    return built


def _summed_over_choices(built: Programs) -> bool:
    """Whether the output was stated equal to a dot over the choices (a gather at a [T, K] index),
    or to a constant times one (GELU's 0.5 moved in front of the sum)."""
    out = built.reference_outputs[0]
    dots = [_unscaled(t) for group in built.evaluator.equal_terms if out in group for t in group]
    return any(t.op == "dot" and _gathered_at_choices(t.args[1]) for t in dots)


def _unscaled(t: Term) -> Term:
    return t.args[0] if t.op == "binary" and t.attrs == ("multiply",) and t.args[1].op == "bcast" else t


def _gathered_at_choices(t: Term) -> bool:
    return t.op == "aligned" and t.attrs[0].startswith("gather:") and t.args[1].shape == (T, K)


@pytest.mark.parametrize("style", sorted(STYLES))
def test_gathered_kernels_are_the_dense_dot_gathered(style):
    built = _checked(STYLES[style])
    gathered = built.evaluator.gathered
    assert len(gathered) >= 2 * K, "a dot of gathered kernels was not stated as the dense dot's gather"
    for written, picked in gathered.items():
        dense, idx = picked.args
        assert dense.shape[0] == E and idx.shape == (T,), "laid out expert-major, gathered at the token's expert"
        assert written.shape == picked.shape
    assert _summed_over_choices(built), "the choices added one by one were not stated as the dot over them"


def _lanes_contracted(router, w1, x):  # a sum over the tokens: no row's own expert
    _, idx = _route(router, x)
    return jnp.einsum("td,tdf->f", x, w1[idx[:, 0]])


def _lane_free(router, w1, w2, x):  # rows of a table looked up, then multiplied: not batched
    _, idx = _route(router, x)
    return w1[idx[:, 0], 0] @ w2[0]


@pytest.mark.parametrize("fn", [_lanes_contracted, _lane_free], ids=["lanes contracted", "lane left free"])
def test_only_dots_batched_over_the_lanes_are_gathered(fn):
    assert not _checked(fn).evaluator.gathered


def _choice_twice(router, w1, x):
    gates, idx = _route(router, x)
    y = lambda e: jnp.einsum("td,tdf->tf", x, w1[e])  # noqa: E731
    return gates[:, :1] * y(idx[:, 0]) + gates[:, :1] * y(idx[:, 0])


def _choice_missing(router, w1, x):
    gates, idx = _route(router, x)
    return gates[:, :1] * jnp.einsum("td,tdf->tf", x, w1[idx[:, 0]]) + x @ w1[0]


def _choices_crossed(router, w1, x):  # each weight with the other choice's expert
    gates, idx = _route(router, x)
    y = lambda e: jnp.einsum("td,tdf->tf", x, w1[e])  # noqa: E731
    return gates[:, :1] * y(idx[:, 1]) + gates[:, 1:] * y(idx[:, 0])


def _one_index_for_both(router, w1, x):  # both weights with the second choice's expert
    gates, idx = _route(router, x)
    y = lambda e: jnp.einsum("td,tdf->tf", x, w1[e])  # noqa: E731
    return gates[:, :1] * y(idx[:, 1]) + gates[:, 1:] * y(idx[:, 1])


@pytest.mark.parametrize(
    "fn",
    [_choice_twice, _choice_missing, _choices_crossed, _one_index_for_both],
    ids=["a choice twice", "a choice missing", "choices crossed", "one index for both"],
)
def test_only_every_choice_once_at_its_own_index_is_the_dot_over_choices(fn):
    built = _checked(fn)
    assert built.evaluator.gathered, "the gathered dots themselves are stated"
    assert not _summed_over_choices(built)


def _two_indices_in_a_product(router, w1, v1, w2, x):  # h's factors gathered at different choices
    _, idx = _route(router, x)
    h = jnp.einsum("td,tdf->tf", x, w1[idx[:, 0]]) * jnp.einsum("td,tdf->tf", x, v1[idx[:, 1]])
    return jnp.einsum("tf,tfd->td", h, w2[idx[:, 0]])


def _two_indices_in_a_dot(router, v1, w2, x):  # the dot's operands gathered at different choices
    _, idx = _route(router, x)
    return jnp.einsum("tf,tfd->td", jnp.einsum("td,tdf->tf", x, v1[idx[:, 1]]), w2[idx[:, 0]])


@pytest.mark.parametrize(
    "fn, last_dots", [(_two_indices_in_a_product, 1), (_two_indices_in_a_dot, 0)], ids=["in a product", "in a dot"]
)
def test_values_gathered_at_two_indices_are_no_one_gather(fn, last_dots):
    """A value read at one choice's expert and another's is no gather at either index: the last
    dot is stated as the gather of a dense dot that reads the product whole, and not at all where
    its two operands are gathered at two indices (every stated fact is evaluated by _checked)."""
    built = _checked(fn)
    assert [w.shape for w in built.evaluator.gathered].count((T, D)) == last_dots


def _top_k(router, x, k=K):  # the raw top-k values as gates (Qwen-MoE, OLMoE: not renormalised)
    return lax.top_k(jax.nn.softmax(x @ router, axis=-1), k)


def _batched_choices(router, w1, w2, x):  # every choice at once: kernels gathered at idx [T, K]
    gates, idx = _top_k(router, x)
    h = jax.nn.relu(jnp.einsum("td,tkdf->tkf", x, w1[idx]))
    return jnp.einsum("tk,tkd->td", gates, jnp.einsum("tkf,tkfd->tkd", h, w2[idx]))


def _raw_loop(router, w1, w2, x):  # the loop with raw top-k values: windows of the whole sort
    gates, idx = _top_k(router, x)
    out = jnp.zeros_like(x)
    for j in range(K):
        h = jax.nn.silu(jnp.einsum("td,tdf->tf", x, w1[idx[:, j]]))
        out = out + gates[:, j : j + 1] * jnp.einsum("tf,tfd->td", h, w2[idx[:, j]])
    return out


def test_choices_gathered_at_once_are_the_dense_dots_gathered_at_every_choice():
    """dot(x, W[idx])[t, k] = dot(x, W)[t, idx[t, k]] for idx [T, K], the lane k free: both dots
    are stated as gathers at the [T, K] index, and the gates' dot over k as the weighted one-hot
    against the dense value (each statement evaluated by _checked)."""
    built = _checked(_batched_choices)
    gathered = built.evaluator.gathered
    assert sorted(w.shape for w in gathered) == [(T, K, D), (T, K, F)]
    assert all(picked.args[1].shape == (T, K) and picked.args[0].shape[0] == E for picked in gathered.values())
    out = built.reference_outputs[0]
    stated = [t for group in built.evaluator.equal_terms if out in group for t in group if t is not out]
    assert any(t.op == "dot" and t.args[1].shape[0] == E for t in stated), "no weighted one-hot against the dense dot"


def test_raw_top_k_values_added_one_by_one_are_the_dot_over_the_choices():
    """A top-k's values are the first k of its sort: the choices [0, K) are a run of the sort's
    lanes, and their sum the dot of that window with the gather at the choices."""
    assert _summed_over_choices(_checked(_raw_loop))


def _first_two_of_three(router, w1, x):  # a run that is not every lane: still its window's dot
    gates, idx = _top_k(router, x, 3)
    y = lambda e: jnp.einsum("td,tdf->tf", x, w1[e])  # noqa: E731
    return gates[:, :1] * y(idx[:, 0]) + gates[:, 1:2] * y(idx[:, 1])


def _last_two_of_three(router, w1, x):  # a run from choice 1: the index window follows it
    gates, idx = _top_k(router, x, 3)
    y = lambda e: jnp.einsum("td,tdf->tf", x, w1[e])  # noqa: E731
    return gates[:, 2:3] * y(idx[:, 2]) + gates[:, 1:2] * y(idx[:, 1])


def _first_and_third(router, w1, x):  # choices 0 and 2: no run of the weights
    gates, idx = _top_k(router, x, 3)
    y = lambda e: jnp.einsum("td,tdf->tf", x, w1[e])  # noqa: E731
    return gates[:, :1] * y(idx[:, 0]) + gates[:, 2:3] * y(idx[:, 2])


def test_only_a_run_of_choices_is_the_dot_over_its_window():
    assert _summed_over_choices(_checked(_first_two_of_three))
    assert _summed_over_choices(_checked(_last_two_of_three))
    assert not _summed_over_choices(_checked(_first_and_third))


def _choices_summed(router, w1, x):  # the lane k contracted: the sum over a token's choices
    _, idx = _top_k(router, x)
    return jnp.einsum("td,tkdf->tf", x, w1[idx])


def _choices_on_both(router, v, w1, x):  # k free on both operands: every pair of a token's choices
    _, idx = _top_k(router, x)
    return jnp.einsum("tkd,tjdf->tkjf", jnp.take(v, idx, axis=0), jnp.take(w1, idx, axis=0))


def test_a_lane_summed_over_or_free_on_both_operands_is_no_gather():
    assert not _checked(_choices_summed).evaluator.gathered
    assert not _checked(_choices_on_both).evaluator.gathered


def test_a_dense_op_meets_the_program_written_on_every_expert():
    """The dense value of relu on a gathered dot is built as a written relu is (its zero moved
    under the expert-major transpose, beside the dot with its operands swapped), so a device's
    relu of every expert's dot meets it."""

    def both(router, w1, x):
        _, idx = _top_k(router, x)
        picked = jax.nn.relu(jnp.einsum("td,tkdf->tkf", x, w1[idx]))
        return picked, jax.nn.relu(jnp.einsum("td,edf->etf", x, w1))

    args = _args(both)
    module = parse_module(jax.jit(both).lower(*args).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    params = [ev.table.make("param", (k,), (), a.shape, "f32") for k, a in enumerate(args)]
    ((picked, written),) = ev.run(module.entry, [[p] for p in params])
    form = gathered_dots.lane_form(ev, picked)
    assert form is not None
    assert form.dense is written or any(form.dense in group and written in group for group in ev.equal_terms)
