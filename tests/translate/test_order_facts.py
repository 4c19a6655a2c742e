"""Facts of argmax and of 0/1 masks (equivci/translate/orders.py, picks.py, elementwise.py),
checked against XLA:

* argmax(f(x)) = argmax(x) for f strictly increasing along the lane (softmax's exp(x - max) / sum);
  never for a decreasing or a sign-unknown step;
* x[argmax(z)] = max(x) along the lane, for x = z or an increasing map of z; not at an argmin;
* (c - m) * m = (c - 1) * m for m a converted predicate (m * m = m); not for other m.

Each translated program is evaluated on its terms against XLA, and every group of terms stated
equal is evaluated too. The end-to-end near misses are tests/soundness (router-*, queue-*).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from one_device import programs as _programs

from equivci.terms.semantics import TermEvalError, evaluate
from equivci.translate import orders

RNG = np.random.default_rng(21)
T, E = 6, 4
X = RNG.standard_normal((T, E)).astype(np.float32)


def _checked(programs, want, params):
    """The output against XLA, and each group of terms stated equal; an argmax has no numpy
    model (semantics.py), so its groups compare the argmax of their operands instead."""
    values = programs.evaluator.values
    try:
        np.testing.assert_allclose(evaluate(programs.reference_outputs[0], params, values), want, rtol=1e-6)
    except TermEvalError:
        pass
    for group in programs.evaluator.equal_terms:
        if _is_argmax(group[0]):
            lanes = [np.argmax(evaluate(t.args[0], params, values), axis=-1) for t in group]
            np.testing.assert_array_equal(lanes[1], lanes[0])
            continue
        try:
            first = evaluate(group[0], params, values)
        except TermEvalError:
            continue
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, params, values), first, rtol=1e-5, atol=1e-6)


def _is_argmax(t) -> bool:
    return t.op == "aligned" and t.attrs[0].startswith("reduce2")


def _argmax_groups(programs):
    return [g for g in programs.evaluator.equal_terms if _is_argmax(g[0])]


INCREASING = {
    "softmax": lambda x: jax.nn.softmax(x, axis=-1),
    "exp of a shift": lambda x: jnp.exp(x - x.max(-1, keepdims=True)),
    "tanh, scaled": lambda x: 3.0 * jnp.tanh(x),
}
NOT_INCREASING = {
    "negated": lambda x: -x,
    "exp of the negation": lambda x: jnp.exp(-x),
    "divided by a sum of any sign": lambda x: x / x.sum(-1, keepdims=True),
    "scaled by a negative": lambda x: -2.0 * jnp.tanh(x),
    "a lane constant less x": lambda x: x.max(-1, keepdims=True) - x,
}


@pytest.mark.parametrize("case", sorted(INCREASING))
def test_the_argmax_of_an_increasing_map_is_the_argmax(case):
    programs, want, _ = _programs(lambda x: jnp.argmax(INCREASING[case](x), axis=-1), (X,))
    groups = _argmax_groups(programs)
    assert groups and all(g[1].args[0] == programs.params[0] for g in groups)
    _checked(programs, want, {0: X})


@pytest.mark.parametrize("case", sorted(NOT_INCREASING))
def test_no_argmax_fact_for_other_maps(case):
    programs, want, _ = _programs(lambda x: jnp.argmax(NOT_INCREASING[case](x), axis=-1), (X,))
    # (exp(-x) keeps the argmax of -x: that group is true, and checked below)
    assert all(g[1].args[0] != programs.params[0] for g in _argmax_groups(programs))
    _checked(programs, want, {0: X})


def _reducer(module) -> str:
    (name,) = [c for c in module.computations if any(i.opcode == "select" for i in module.computations[c].instructions)]
    return name


def test_only_an_argmax_reducer_is_an_argmax():
    _, _, argmax = _programs(lambda x: jnp.argmax(x, axis=-1), (X,))
    _, _, argmin = _programs(lambda x: jnp.argmin(x, axis=-1), (X,))
    assert orders.orders_only(argmax, _reducer(argmax)) and orders.is_argmax(argmax, _reducer(argmax))
    assert orders.orders_only(argmin, _reducer(argmin)) and not orders.is_argmax(argmin, _reducer(argmin))


def _max_groups(programs):
    return [g for g in programs.evaluator.equal_terms if g[1].op == "reduce" and g[1].attrs[0] == "maximum"]


def _gate(x):
    probs = jax.nn.softmax(x, axis=-1)
    return jnp.take_along_axis(probs, jnp.argmax(x, axis=-1)[:, None], axis=-1)[:, 0]


def _gate_at_argmin(x):
    probs = jax.nn.softmax(x, axis=-1)
    return jnp.take_along_axis(probs, jnp.argmin(x, axis=-1)[:, None], axis=-1)[:, 0]


def _least_first(a, b):  # an argmin comparator: the smaller value (the lower index on a tie)
    (av, ai), (bv, bi) = a, b
    pick = (av < bv) | ((av == bv) & (ai < bi))
    return jax.lax.select(pick, av, bv), jax.lax.select(pick, ai, bi)


def _gate_at_argmin_from_minus_inf(x):
    """An argmin from -inf, which wins every comparison: the index stays 0, no max's position."""
    positions = jnp.broadcast_to(jnp.arange(E, dtype=jnp.int32), x.shape)
    _, idx = jax.lax.reduce((x, positions), (-jnp.inf, 0), _least_first, (1,))
    return jnp.take_along_axis(x, idx[:, None], axis=-1)[:, 0]


def _gate_of_negated(x):  # -x is no increasing map of x: its largest value is not at x's argmax
    return jnp.take_along_axis(-x, jnp.argmax(x, axis=-1)[:, None], axis=-1)[:, 0]


def test_a_pick_at_the_argmax_is_the_max():
    programs, want, _ = _programs(_gate, (X,))
    picks = [g for g in _max_groups(programs) if g[0].op != "reduce"]
    assert picks, "the pick at the argmax was not stated as the max"
    for group in picks:
        np.testing.assert_allclose(evaluate(group[1], {0: X}, programs.evaluator.values), want, rtol=1e-6)
    _checked(programs, want, {0: X})


@pytest.mark.parametrize(
    "fn",
    [_gate_at_argmin, _gate_at_argmin_from_minus_inf, _gate_of_negated],
    ids=["argmin", "argmin from -inf", "negated"],
)
def test_other_picks_are_no_max(fn):
    programs, want, _ = _programs(fn, (X,))
    assert not [g for g in _max_groups(programs) if g[0].op != "reduce"]
    _checked(programs, want, {0: X})


IDS = RNG.integers(0, E, (T,)).astype(np.int32)


def _queue(m):
    return (jnp.cumsum(m, axis=0) - m) * m


def _queue_minus_one(m):
    return (jnp.cumsum(m, axis=0) - 1) * m


def _product_groups(programs):
    return [g for g in programs.evaluator.equal_terms if g[0].attrs == ("multiply",) and g[1].attrs == ("multiply",)]


@pytest.mark.parametrize("fn", [_queue, _queue_minus_one], ids=["c - m", "c - 1"])
def test_a_queue_position_is_one_value(fn):
    one_hot = lambda ids: fn((ids[:, None] == jnp.arange(E)).astype(jnp.int32))  # noqa: E731
    programs, want, _ = _programs(one_hot, (IDS,))
    if fn is _queue:
        assert _product_groups(programs), "(c - m) * m was not stated as (c - 1) * m"
    _checked(programs, want, {0: IDS})


def test_a_value_that_is_not_zero_or_one_keeps_its_product():
    spread = lambda ids: (ids[:, None] + jnp.zeros((1, E), jnp.int32)).astype(jnp.float32)  # noqa: E731
    programs, want, _ = _programs(lambda ids: _queue(spread(ids)), (IDS,))  # a convert, but of no predicate
    assert not _product_groups(programs)
    _checked(programs, want, {0: IDS})
