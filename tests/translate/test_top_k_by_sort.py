"""Top-k written as a sort (equivci/translate/sorts.py, orders.sort_direction, picks.sorted_pick),
checked against XLA, ties included:

* jnp.sort's comparator (-0.0 mapped to 0.0, NaN to one NaN, then a total-order `<`) is an
  ascending sort by the key; a bare total-order `<`, a `<=` or a comparator reading the payload
  is no plain order;
* `argsort(-p)[..., :k]`, `lax.sort((-p, iota))[1][..., :k]` and `lax.top_k(p, k)[1]` are one
  term, and so are their picks `take_along_axis(p, idx)` and `top_k(p)[0]`, ties in index order;
  never the bottom-k (`argsort(p)`), a window one off, or a pick of another value than the keys
  as the sorted keys.

In floats the sort by -p and top_k differ where p holds a NaN or both zeros (XLA's top_k ranks
0.0 above -0.0 and a NaN first): the facts hold over the reals, and the test shows where they end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from one_device import programs as _programs

from equivci.hlo.parser import parse_module
from equivci.terms.semantics import evaluate
from equivci.translate import orders

K = 3
TIES = np.array(
    [
        [1.0, 2.0, 2.0, 0.5, 2.0, 1.0, -3.0, 0.0],
        [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0],
        [0.1, -1.0, 4.0, 4.0, -1.0, 0.1, 7.0, 7.0],
        [-np.inf, 5.0, 5.0, np.inf, -2.0, 5.0, 1.0, 1.0],
    ],
    dtype=np.float32,
)
RANDOM = np.random.default_rng(7).standard_normal((5, 8)).astype(np.float32)


def _positions(x):
    return lax.broadcasted_iota(jnp.int32, x.shape, 1)


TOP_INDICES = {
    "argsort of the negation": lambda p: jnp.argsort(-p, axis=-1)[:, :K],
    "sort of (-p, iota)": lambda p: lax.sort((-p, _positions(p)), dimension=1, num_keys=1)[1][:, :K],
    "lax.top_k": lambda p: lax.top_k(p, K)[1],
}
NOT_TOP_INDICES = {
    "bottom-k: argsort without the negation": lambda p: jnp.argsort(p, axis=-1)[:, :K],
    "k one off: the window from 1": lambda p: jnp.argsort(-p, axis=-1)[:, 1 : K + 1],
    "the last k of the sort of -p": lambda p: jnp.argsort(-p, axis=-1)[:, -K:],
}
TOP_VALUES = {
    "picked at argsort(-p)": lambda p: jnp.take_along_axis(p, jnp.argsort(-p, axis=-1)[:, :K], axis=-1),
    "picked at the sort of (-p, iota)": lambda p: jnp.take_along_axis(p, TOP_INDICES["sort of (-p, iota)"](p), axis=-1),
    "lax.top_k": lambda p: lax.top_k(p, K)[0],
}


def _term(fn, x):
    programs, want, _ = _programs(fn, (x,))
    got = evaluate(programs.reference_outputs[0], {0: x}, programs.evaluator.values)
    np.testing.assert_array_equal(got, want)  # the term's numpy model is what XLA computes
    return programs


def _groups_hold(programs, params) -> None:
    """Every group of terms the translation states equal holds on these inputs."""
    values = programs.evaluator.values
    for group in programs.evaluator.equal_terms:
        first = evaluate(group[0], params, values)
        for other in group[1:]:
            np.testing.assert_array_equal(evaluate(other, params, values), first)


def _terms_equal(programs) -> set[str]:
    """The output term and every term stated equal to it, written out (each program has its own
    term table: terms of two programs are compared by what they are)."""
    out = programs.reference_outputs[0]
    return {repr(t) for t in (out, *(t for g in programs.evaluator.equal_terms if out in g for t in g))}


@pytest.mark.parametrize("x", [TIES, RANDOM], ids=["ties", "random"])
def test_top_k_indices_by_sort_are_one_term(x):
    terms = {case: repr(_term(fn, x).reference_outputs[0]) for case, fn in TOP_INDICES.items()}
    assert len(set(terms.values())) == 1, terms.keys()
    want = np.asarray(jax.jit(TOP_INDICES["lax.top_k"])(x))
    for case, fn in TOP_INDICES.items():  # XLA itself: ties in index order in every style
        np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x)), want, err_msg=case)


@pytest.mark.parametrize("case", sorted(NOT_TOP_INDICES))
def test_no_top_k_for_other_windows_or_orders(case):
    top = _term(TOP_INDICES["lax.top_k"], TIES).reference_outputs[0]
    other = _term(NOT_TOP_INDICES[case], TIES).reference_outputs[0]
    assert repr(other) != repr(top)
    assert not np.array_equal(
        np.asarray(jax.jit(NOT_TOP_INDICES[case])(TIES)), np.asarray(jax.jit(TOP_INDICES["lax.top_k"])(TIES))
    )


@pytest.mark.parametrize("x", [TIES, RANDOM], ids=["ties", "random"])
def test_top_k_values_by_sort_meet_top_k(x):
    top = repr(_term(TOP_VALUES["lax.top_k"], x).reference_outputs[0])
    for case, fn in TOP_VALUES.items():
        programs = _term(fn, x)
        assert top in _terms_equal(programs), case
        _groups_hold(programs, {0: x})


def test_a_pick_of_another_value_is_that_value_sorted_along():
    """take_along_axis(v, argsort(-p)) is v carried through the sort by p: never the sorted p."""
    v = RANDOM[::-1].copy()

    def picked(p, v):
        return jnp.take_along_axis(v, jnp.argsort(-p, axis=-1)[:, :K], axis=-1)

    programs, want, _ = _programs(picked, (TIES[:, :8].repeat(2, 0)[:5], v))
    top = repr(_term(TOP_VALUES["lax.top_k"], TIES[:, :8].repeat(2, 0)[:5]).reference_outputs[0])
    assert top not in _terms_equal(programs)
    params = {0: TIES[:, :8].repeat(2, 0)[:5], 1: v}
    _groups_hold(programs, params)
    np.testing.assert_array_equal(evaluate(programs.reference_outputs[0], params, programs.evaluator.values), want)


def test_the_float_corners_where_the_sort_and_top_k_part():
    """Outside the reals: a NaN is top_k's first and argsort(-p)'s last; 0.0 ranks above -0.0 in
    top_k and ties with it in argsort(-p). The facts are stated over the reals."""
    corners = np.array([[np.nan, 1.0, 2.0, 0.5], [0.0, -0.0, 0.0, -0.0]], np.float32)
    by_top_k = np.asarray(jax.jit(lambda p: lax.top_k(p, 3)[1])(corners))
    by_sort = np.asarray(jax.jit(lambda p: jnp.argsort(-p, axis=-1)[:, :3])(corners))
    assert by_top_k.tolist() == [[0, 2, 1], [0, 2, 1]]
    assert by_sort.tolist() == [[2, 1, 3], [0, 1, 2]]


def _comparator(fn, x) -> tuple:
    module = parse_module(jax.jit(fn).lower(x).as_text(dialect="hlo"))
    (sort,) = [i for c in module.computations.values() for i in c.instructions if i.opcode == "sort"]
    return module, sort.attrs["to_apply"].lstrip("%"), len(sort.operands)


@pytest.mark.parametrize(
    ("fn", "x", "key_dtype", "direction"),
    [
        (lambda p: jnp.argsort(p, axis=-1), RANDOM, "f32", "LT"),
        (lambda p: jnp.sort(p, axis=-1), RANDOM, "f32", "LT"),
        (lambda i: jnp.argsort(i, axis=-1), RANDOM.astype(np.int32), "s32", "LT"),
        (lambda p: jnp.argsort(p > 0, axis=-1, stable=True), RANDOM, "pred", "LT"),
        (lambda p: lax.sort((p, _positions(p)), dimension=1, num_keys=1, is_stable=True), RANDOM, "f32", "LT"),
        # both keys compared: ties are broken by the payload, no order by the key alone
        (lambda p: lax.sort((p, _positions(p)), dimension=1, num_keys=2, is_stable=True), RANDOM, "f32", None),
    ],
)
def test_the_direction_of_jax_comparators(fn, x, key_dtype, direction):
    module, comparator, operands = _comparator(fn, x)
    assert orders.sort_direction(module, comparator, operands, key_dtype) == direction


def _hand_written(root: str, extra: str = "") -> tuple:
    text = f"""HloModule m

%cmp (a: f32[], b: f32[], c: s32[], d: s32[]) -> pred[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
{extra}  ROOT %r = pred[] {root}
}}

ENTRY %main (x: f32[4]) -> f32[4] {{
  ROOT %x = f32[4] parameter(0)
}}
"""
    return parse_module(text), "cmp"


@pytest.mark.parametrize(
    ("root", "extra", "direction"),
    [
        ("compare(%a, %b), direction=LT", "", "LT"),
        ("compare(%a, %b), direction=GT", "", "GT"),
        ("compare(%b, %a), direction=LT", "", "GT"),
        # a total order ranks -0.0 before 0.0, where the numpy model ties them
        ("compare(%a, %b), direction=LT, order=TOTAL", "", None),
        ("compare(%a, %b), direction=LE", "", None),
        ("compare(%c, %d), direction=LT", "", None),
        # a key moved past a constant: |x| order, not x's
        (
            "compare(%sa, %sb), direction=LT",
            "  %z = f32[] constant(0)\n  %na = pred[] compare(%a, %z), direction=LT\n"
            "  %nb = pred[] compare(%b, %z), direction=LT\n  %ma = f32[] select(%na, %z, %a)\n"
            "  %mb = f32[] select(%nb, %z, %b)\n  %sa = f32[] select(%na, %b, %ma)\n  %sb = f32[] select(%nb, %a, %mb)\n",
            None,
        ),
    ],
)
def test_the_direction_of_hand_written_comparators(root, extra, direction):
    module, name = _hand_written(root, extra)
    assert orders.sort_direction(module, name, 2, "f32") == direction


def test_a_pick_at_a_sort_of_other_positions_is_no_sorted_value():
    """take_along_axis(p, sort(-p, y)[1]) for y no positions (here reversed) picks at y's values,
    not at the sort's permutation: no sorted value is stated for it."""

    def picked(p):
        reversed_positions = p.shape[1] - 1 - _positions(p)
        idx = lax.sort((-p, reversed_positions), dimension=1, num_keys=1)[1][:, :K]
        return jnp.take_along_axis(p, idx, axis=-1)

    top = repr(_term(TOP_VALUES["lax.top_k"], RANDOM).reference_outputs[0])
    programs = _term(picked, RANDOM)
    assert top not in _terms_equal(programs)
    _groups_hold(programs, {0: RANDOM})
    assert not np.array_equal(np.asarray(jax.jit(picked)(RANDOM)), np.asarray(jax.jit(TOP_VALUES["lax.top_k"])(RANDOM)))


def test_positions_past_the_folding_budget_are_one_term_too():
    """A [rows, 512] lane set past Budgets.fold_elements: the positions stay a broadcast line, in
    one form for the argsort's iota and the top-k's."""
    wide = np.random.default_rng(9).standard_normal((160, 512)).astype(np.float32)
    terms = {
        case: repr(_term(TOP_INDICES[case], wide).reference_outputs[0])
        for case in ("argsort of the negation", "lax.top_k")
    }
    assert len(set(terms.values())) == 1
