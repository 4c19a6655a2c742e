"""Integer index compares in one form (equivci/translate/elementwise.py), checked against XLA.

* a compare with its constant operand on the left is the mirrored compare with it on the right
  (c < x is x > c, NaN included), so `ids == t[:, None]` and `t[:, None] == ids` are one one-hot;
* (x - c == k) is (x == k + c) for integers, exact modulo 2^bits, so `one_hot(t - lo, n)` on a
  shard is `t == lo + arange(n)`; not for <, <= (wraparound carries x - c past k + c);
* select(p, x, 0) is x * p over the reals: a pick written `where(ids == t, x, 0)` meets one written
  `x * one_hot(t)`; stated of the select itself where the builder moved a constant factor of x in
  front, f * select(p, x, 0);
* a gather of f(a, bcast(m)) picks a too: the gather of a is stated as its one-hot sum beside it.

Each translated program is evaluated on its terms and compared with what XLA computes; every
group of terms stated equal is evaluated too. The end-to-end near misses are tests/soundness
(pick-where-*, pick-local-one-hot*).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from one_device import programs

from equivci.terms.semantics import evaluate
from equivci.terms.spec import parse_compare

RNG = np.random.default_rng(13)
T, V = 6, 8
IDS = RNG.integers(0, V, (T,)).astype(np.int32)
# near the ends of int32: x - 5 wraps where the one-hot's compare must still be exact
EDGES = np.array([np.iinfo(np.int32).min + 2, np.iinfo(np.int32).max - 1, 3, 7, 0, 12], np.int32)


def _programs(fn, args):
    built, want, _ = programs(fn, args)
    return built, want


def _terms(t, seen=None):
    seen = set() if seen is None else seen
    if id(t) not in seen:
        seen.add(id(t))
        yield t
        for a in t.args:
            yield from _terms(a, seen)


def _compares(term):
    return [t for t in _terms(term) if t.op == "binary" and parse_compare(t.attrs[0])]


def _check_values(programs, want, params):
    values = programs.evaluator.values
    got = evaluate(programs.reference_outputs[0], params, values)
    np.testing.assert_array_equal(got, want)
    for group in programs.evaluator.equal_terms:
        first = evaluate(group[0], params, values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, params, values), first, atol=1e-6)


MIRRORED = {
    "==": lambda c, x: c == x,
    "!=": lambda c, x: c != x,
    "<": lambda c, x: c < x,
    "<=": lambda c, x: c <= x,
    ">": lambda c, x: c > x,
    ">=": lambda c, x: c >= x,
}


@pytest.mark.parametrize("op", sorted(MIRRORED))
def test_a_constant_on_the_left_is_mirrored_to_the_right(op):
    fn = lambda t: MIRRORED[op](jnp.arange(V)[None, :], t[:, None])  # noqa: E731
    programs, want = _programs(fn, (IDS,))
    (compare,) = _compares(programs.reference_outputs[0])
    assert programs.evaluator.folded(compare.args[1]) is not None, "the constant stays on the right"
    assert programs.evaluator.folded(compare.args[0]) is None
    _check_values(programs, want, {0: IDS})


def _one_hot_of_local(t):
    return jax.nn.one_hot(t - 5, V, dtype=jnp.int32)


def _ids_plus_offset(t):
    return (t[:, None] + 3 == jnp.arange(V)).astype(jnp.int32)


def _ne_of_local(t):
    return (t[:, None] - 5 != jnp.arange(V)).astype(jnp.int32)


@pytest.mark.parametrize("fn", [_one_hot_of_local, _ids_plus_offset, _ne_of_local], ids=["one_hot", "plus", "ne"])
@pytest.mark.parametrize("ids", [IDS, EDGES], ids=["ids", "int32 ends"])
def test_an_offset_of_an_equality_moves_to_the_constant(fn, ids):
    programs, want = _programs(fn, (ids,))
    (compare,) = _compares(programs.reference_outputs[0])
    assert not any(t.op == "binary" and t.attrs[0] in ("add", "subtract") for t in _terms(compare))
    _check_values(programs, want, {0: ids})


def _less_of_local(t):
    return (t[:, None] - 5 < jnp.arange(V)).astype(jnp.int32)


def test_an_offset_of_an_order_stays():
    """t - 5 < k is not t < k + 5 where t - 5 wraps (int32's least values)."""
    programs, want = _programs(_less_of_local, (EDGES,))
    (compare,) = _compares(programs.reference_outputs[0])
    assert any(t.op == "binary" and t.attrs[0] == "subtract" for t in _terms(compare))
    _check_values(programs, want, {0: EDGES})


def _products(programs):
    return [g for g in programs.evaluator.equal_terms if g[0].op == "ternary" and g[1].attrs == ("multiply",)]


def test_a_select_against_zeros_is_the_product_with_its_mask():
    x = RNG.standard_normal((T, V)).astype(np.float32)
    fn = lambda x, t: jnp.where(jnp.arange(V) == t[:, None], x, 0.0).sum(-1)  # noqa: E731
    programs, want = _programs(fn, (x, IDS))
    assert _products(programs), "select(p, x, 0) was not stated as x * p"
    _check_values(programs, want, {0: x, 1: IDS})


def test_a_select_of_a_scaled_branch_states_the_unscaled_product():
    x = RNG.standard_normal((T, V)).astype(np.float32)
    fn = lambda x, t: jnp.where(jnp.arange(V) == t[:, None], 2.5 * x, 0.0).sum(-1)  # noqa: E731
    programs, want = _programs(fn, (x, IDS))
    (top,) = [t for t in _terms(programs.reference_outputs[0]) if t.op == "reduce"]
    (select,) = [t for t in _terms(top) if t.op == "ternary"]  # the sum is 2.5 * sum(select(p, x, 0))
    assert [g for g in _products(programs) if g[0] is select], "select(p, x, 0) under 2.5 was not stated as x * p"
    _check_values(programs, want, {0: x, 1: IDS})


@pytest.mark.parametrize("other", [1.0, -1e30], ids=["ones", "a large negative"])
def test_a_select_against_other_values_is_no_product(other):
    x = RNG.standard_normal((T, V)).astype(np.float32)
    fn = lambda x, t: jnp.where(jnp.arange(V) == t[:, None], x, other).sum(-1)  # noqa: E731
    programs, _ = _programs(fn, (x, IDS))
    assert not _products(programs)


def test_a_pick_through_a_broadcast_operand_states_the_inner_pick():
    """log_softmax(x) at the labels is x at the labels less lse (gathers.py); that pick of x is
    stated as its one-hot sum too, the form a vocabulary-parallel device sums its logits in."""
    x = RNG.standard_normal((T, V)).astype(np.float32)
    fn = lambda x, t: jnp.take_along_axis(jax.nn.log_softmax(x), t[:, None], axis=-1)[:, 0]  # noqa: E731
    programs, want = _programs(fn, (x, IDS))
    summed = [g for g in programs.evaluator.equal_terms if g[1].op == "reduce" and g[0].op == "aligned"]
    assert any(g[0].args[0] == programs.params[0] for g in summed), "the pick of x itself has no one-hot sum"
    np.testing.assert_allclose(
        evaluate(programs.reference_outputs[0], {0: x, 1: IDS}, programs.evaluator.values), want, rtol=1e-5, atol=1e-5
    )
    values = programs.evaluator.values
    for gathered, *one_hots in summed:
        for one_hot in one_hots:
            np.testing.assert_allclose(
                evaluate(one_hot, {0: x, 1: IDS}, values), evaluate(gathered, {0: x, 1: IDS}, values), atol=1e-5
            )


S = 16  # key positions
W = 6  # a decode window's width


def _with_valid_start(mask):
    """mask(q, k) of the query positions `start + arange(T)` and the key positions `arange(S)`,
    times the rows a slice at start reads (so start is taken to lie in [0, S - T])."""

    def fn(table, start):
        q, k = start + jnp.arange(T), jnp.arange(S)
        return mask(q, k).astype(jnp.float32) * jax.lax.dynamic_slice(table, (start,), (T,))[..., :, None]

    return fn


DISTANCE_FORMS = {
    # the reference's form: keys at or before the query, inside its window
    "keys": lambda q, k: (k[None, :] <= q[:, None]) & (k[None, :] > q[:, None] - W),
    # the distance q - k, as a decode step writes it
    "distance": lambda q, k: ((q[:, None] - k[None, :]) >= 0) & ((q[:, None] - k[None, :]) < W),
    # the distance the other way, k - q, with the bounds on the left
    "negated": lambda q, k: (0 >= k[None, :] - q[:, None]) & (1 - W <= k[None, :] - q[:, None]),
}


def _mask_term(fn, start):
    table = np.arange(S, dtype=np.float32)
    built, want, _ = programs(fn, (table, np.int32(start)))
    return built, want, {0: table, 1: np.int32(start)}


@pytest.mark.parametrize("start", [0, 5, S - T])
@pytest.mark.parametrize("form", ["distance", "negated"])
def test_a_distance_of_positions_is_compared_as_the_positions(form, start):
    """(start + arange(t))[:, None] - arange(s) >= 0 is arange(s) <= start + arange(t) where start's
    bounds keep the difference inside int32: the order tests of the distance become tests of the
    query positions against a constant, the very terms the reference's key form builds (both forms
    in one program: two compares in all, up to the half-open forms stated beside them)."""
    both = lambda q, k: jnp.stack([DISTANCE_FORMS[form](q, k), DISTANCE_FORMS["keys"](q, k)])  # noqa: E731
    built, want, params = _mask_term(_with_valid_start(both), start)
    got = built.reference_outputs[0]
    assert not any(t.op == "binary" and t.attrs[0] == "subtract" and t.dtype == "s32" for t in _terms(got))
    classes = {c: c for c in _compares(got)}
    for group in built.evaluator.equal_terms:  # the half-open form stated beside a test
        for t in group[1:]:
            if group[0] in classes and t in classes:
                classes[t] = classes[group[0]]
    assert len(set(classes.values())) == 2, "the distance's tests are not the key form's"
    np.testing.assert_array_equal(evaluate(got, params, built.evaluator.values), want)


def _far_distance(q, k):
    """q - (k - 2^31 + 10): wraps where q - k >= 10, which start's bounds allow."""
    return (q[:, None] - (k[None, :] - (2**31 - 10))) < 0


def test_a_distance_that_can_wrap_stays():
    built, want, params = _mask_term(_with_valid_start(_far_distance), 3)
    got = built.reference_outputs[0]
    assert any(t.op == "binary" and t.attrs[0] == "subtract" for t in _terms(got))
    np.testing.assert_array_equal(evaluate(got, params, built.evaluator.values), want)


def test_an_integer_order_test_is_half_open():
    """t <= k is stated equal to t < k + 1 and t > k to t >= k + 1 on integers, so `d <= w - 1`
    and `d < w` meet; not at the dtype's largest value, where k + 1 wraps."""
    top = np.iinfo(np.int32).max
    fn = lambda t: jnp.stack(  # noqa: E731
        [t[:, None] <= jnp.arange(V) + 2, t[:, None] < jnp.arange(V) + 3, t[:, None] > jnp.arange(V)]
    ).astype(jnp.int32) + (t[:, None] <= top - jnp.arange(V)).astype(jnp.int32)
    programs, want = _programs(fn, (EDGES,))
    written = set(_compares(programs.reference_outputs[0]))
    stated = {g[0]: g[1] for g in programs.evaluator.equal_terms if g[0] in written}
    strict = [c for c in written if c.attrs[0] == "compare-LT:s32"]
    assert stated and all(g.attrs[0] in ("compare-LT:s32", "compare-GE:s32") for g in stated.values())
    assert any(g in strict for g in stated.values()), "t <= k + 2 does not meet t < k + 3"
    assert len(stated) == 2, "the test against the largest int32 has no half-open form"
    _check_values(programs, want, {0: EDGES})


def _near_top(q, k):
    """q - 5 < [2^31 - 3, 3, 7, ...]: q - 5 never wraps, but 2^31 - 3 + 5 does."""
    bound = np.arange(S, dtype=np.int32)
    bound[0] = 2**31 - 3
    return (q[:, None] - 5) < jnp.asarray(bound)[None, :]


def test_an_order_test_whose_moved_constant_wraps_stays():
    built, want, params = _mask_term(_with_valid_start(_near_top), 3)
    got = built.reference_outputs[0]
    assert any(t.op == "binary" and t.attrs[0] == "subtract" for t in _terms(got))
    np.testing.assert_array_equal(evaluate(got, params, built.evaluator.values), want)
