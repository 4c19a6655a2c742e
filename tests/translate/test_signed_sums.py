"""Sums of signed terms in one form (equivci/translate/signed_sums.py), checked against XLA.

Over the reals, a value built by additions, subtractions, negations, constant factors and reshapes
is the combination Σ c_i · a_i of its atoms, whatever the order and grouping: the translator states
each such float term equal to that combination in one order. Written orders of one combination meet
(a cross-entropy's `log_sum + m - target` and log-softmax's `-((target - m) - log_sum)`); other
coefficients (a sign flipped, a term twice) do not. Each stated pair is evaluated against what XLA
computes. The end-to-end near misses are tests/soundness (ce-signed-sum*).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from one_device import leaf, programs

from equivci.hlo.ir import Shape
from equivci.hlo.parser import parse_module
from equivci.options import Budgets
from equivci.prove.programs import build_programs
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.translate import signed_sums
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(5)
ARGS = tuple(RNG.normal(size=(4,)).astype(np.float32) for _ in range(3))  # target, m, log_sum

# one combination, log_sum + m - target, written in several orders and groupings
SAME = {
    "lse-minus-target": lambda t, m, s: s + m - t,
    "negated-log-softmax": lambda t, m, s: -((t - m) - s),
    "max-first": lambda t, m, s: m + (s - t),
    "negated-then-added": lambda t, m, s: -(t - s) + m,
    "scaled-alike": lambda t, m, s: 0.5 * ((2.0 * s + 2.0 * m) - 2.0 * t),
    "keepdims-squeezed": lambda t, m, s: (s[:, None] + m[:, None])[:, 0] - t,
}
# near misses: other coefficients
OTHER = {
    "minus-max": lambda t, m, s: s - m - t,
    "target-twice": lambda t, m, s: (s - t) + (m - t),
    "target-added": lambda t, m, s: -((-t - m) - s),
    "half-max": lambda t, m, s: s + 0.5 * m - t,
    "keepdims-minus-max": lambda t, m, s: (s[:, None] - m[:, None])[:, 0] - t,
}


# a sum over the vocabulary of log-probabilities, Σ (x - lse) = Σ x - V · lse, written several ways
ROWS = (RNG.normal(size=(4, 8)).astype(np.float32), RNG.normal(size=(4,)).astype(np.float32))  # x, lse
SPREAD = {
    "mean-of-log-probs": lambda x, lse: -jnp.mean(x - lse[:, None], axis=-1),
    "lse-less-mean": lambda x, lse: lse - jnp.sum(x, axis=-1) / 8,
    "summed-then-scaled": lambda x, lse: -(jnp.sum(x - lse[:, None], axis=-1) / 8),
}
SPREAD_OTHER = {
    "lse-less-sum": lambda x, lse: lse - jnp.sum(x, axis=-1),
    "lse-counted-once": lambda x, lse: -(jnp.sum(x, axis=-1) - lse) / 8,
}


# log-softmax over rows, its subtrahends broadcast along the row: x - lse written with one broadcast
# of the sum m + log_sum (a vocabulary shard's `logits - (m + log(psum(...)))`) or two
LOG_SOFTMAX_ARGS = (ROWS[0], ARGS[1], ARGS[2])  # x [4, 8], m, log_sum
LOG_SOFTMAX = {
    "broadcast-sum": lambda x, m, s: x - (m + s)[:, None],
    "two-broadcasts": lambda x, m, s: (x - m[:, None]) - s[:, None],
    "keepdims-sum": lambda x, m, s: x - (m[:, None] + s[:, None]),
}
LOG_SOFTMAX_OTHER = {
    "broadcast-difference-of-other-sign": lambda x, m, s: x - (m - s)[:, None],
    "max-once-more": lambda x, m, s: x - (m + s)[:, None] - m[:, None],
}


def _form(fn, args=ARGS):
    """The output's stated one form (the output itself when it is that form already), as text over
    the inputs, after checking every stated pair against XLA."""
    built, want, _ = programs(fn, args)
    values, params = built.evaluator.values, dict(enumerate(args))
    out = built.reference_outputs[0]
    np.testing.assert_allclose(evaluate(out, params, values), want, rtol=1e-5, atol=1e-6)
    form = out
    for group in built.evaluator.equal_terms:
        first = evaluate(group[0], params, values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, params, values), first, rtol=1e-5, atol=1e-6)
        if group[0] is out:
            form = group[1]
    return _text(form)


def _text(t) -> str:
    return f"{t.op}{t.attrs}({', '.join(_text(a) for a in t.args)})"


def test_written_orders_of_one_combination_meet():
    forms = {name: _form(fn) for name, fn in SAME.items()}
    assert len(set(forms.values())) == 1, forms


@pytest.mark.parametrize("name", sorted(OTHER))
def test_other_coefficients_do_not_meet(name):
    assert _form(OTHER[name]) != _form(SAME["lse-minus-target"])


def _stated(fn, budgets: Budgets = Budgets()) -> int:
    """How many groups state the output equal to other terms (both programs are fn's)."""
    module = parse_module(jax.jit(fn).lower(*ARGS).as_text(dialect="hlo", debug_info=True))
    inputs = tuple(leaf(f"[{k}]", a) for k, a in enumerate(ARGS))
    out = (leaf("[0]", np.asarray(jax.jit(fn)(*ARGS))),)
    built = build_programs(module, module, inputs, out, 1, budgets=budgets)
    return sum(group[0] is built.reference_outputs[0] for group in built.evaluator.equal_terms)


def test_cancelled_terms_stay():
    # (t - m) + m is t over the reals, but not where m is infinite: both terms of m stay
    kept = _form(lambda t, m, s: (m + t) - m)
    assert kept == _form(lambda t, m, s: (t - m) + m)
    assert kept != _form(lambda t, m, s: t + 0.0 * m)


def test_a_sum_of_log_probabilities_is_spread_over_its_terms():
    forms = {name: _form(fn, ROWS) for name, fn in SPREAD.items()}
    assert len(set(forms.values())) == 1, forms


def test_a_broadcast_sum_is_the_sum_of_the_broadcasts():
    """bcast(a + b) = bcast(a) + bcast(b) (exact: a broadcast copies): log-softmax's `x - (m + s)`
    on a vocabulary shard meets the reference's `(x - m) - s`."""
    forms = {name: _form(fn, LOG_SOFTMAX_ARGS) for name, fn in LOG_SOFTMAX.items()}
    assert len(set(forms.values())) == 1, forms


@pytest.mark.parametrize("name", sorted(LOG_SOFTMAX_OTHER))
def test_other_broadcast_sums_do_not_meet(name):
    assert _form(LOG_SOFTMAX_OTHER[name], LOG_SOFTMAX_ARGS) != _form(LOG_SOFTMAX["two-broadcasts"], LOG_SOFTMAX_ARGS)


@pytest.mark.parametrize("name", sorted(SPREAD_OTHER))
def test_other_counts_of_the_spread_term_do_not_meet(name):
    assert _form(SPREAD_OTHER[name], ROWS) != _form(SPREAD["lse-less-mean"], ROWS)


def test_a_plain_sum_gives_no_signed_form_but_its_terms_in_input_order():
    """No term subtracted: not one_form's; three or more terms get plain_form's order, by the inputs
    they read (t, m, s), and every grouping meets it; a sum in that order already states nothing."""
    assert _stated(lambda t, m, s: (t + m) + s) == 0
    assert _stated(lambda t, m, s: (s + m) + t) > 0
    forms = {
        _form(fn) for fn in (lambda t, m, s: (s + m) + t, lambda t, m, s: s + (t + m), lambda t, m, s: (t + m) + s)
    }
    assert len(forms) == 1, forms
    assert _stated(lambda t, m, s: s + t) == 0  # two terms: the commuting rule's


def test_a_sum_past_the_budget_keeps_its_written_form():
    fn = lambda t, m, s: ((s + m) - t) + jnp.tanh(s)  # noqa: E731
    assert _stated(fn) > 0
    assert _stated(fn, Budgets(signed_terms=3)) == 0


def _chain(ev: Evaluator, count: int, last: str) -> Term:
    """x_{count-1} + ... + x_1, then `last` (add or subtract) x_0: a left-deep sum of `count` atoms, as
    a residual stream adds each layer's output to the sum of the earlier ones (inputs numbered down,
    so that the sum is not in its one order already)."""
    shape = Shape("f32", (4,))
    xs = [ev.table.make("param", (k,), (), (4,), "f32") for k in reversed(range(count))]
    total = xs[0]
    for x in xs[1:-1]:
        total = ev.mk("binary", ("add",), [total, x], shape)
    return ev.mk("binary", (last,), [total, xs[-1]], shape)


@pytest.mark.parametrize("last, form", [("subtract", signed_sums.one_form), ("add", signed_sums.plain_form)])
def test_a_sum_of_exactly_the_budget_has_its_form_and_one_more_atom_not(last, form):
    """The budget counts atoms however deep the sum: `signed_terms` atoms get their form, one more none."""
    limit = Budgets().signed_terms
    ev = Evaluator(None, TermTable(), 1)
    assert form(ev, _chain(ev, limit, last)) is not None
    assert form(ev, _chain(ev, limit + 1, last)) is None


@pytest.mark.parametrize("last, form", [("subtract", signed_sums.one_form), ("add", signed_sums.plain_form)])
def test_a_long_sum_is_given_up_without_walking_it(monkeypatch, last, form):
    """Work counted: a sum of 200 atoms, past the budget, is given up after reading about as many
    terms as the budget allows, not the whole sum: the residual stream of a 126-layer model walked
    to its first term at every layer made the translation quadratic in the depth."""
    ev = Evaluator(None, TermTable(), 1)
    chain = _chain(ev, 200, last)
    read: list = []
    monkeypatch.setattr(ev, "scale_of", lambda t, seen=ev.scale_of: read.append(t) or seen(t))
    assert form(ev, chain) is None
    assert len(read) <= Budgets().signed_terms + 2
