"""Windows lifted out of ops (equivci/translate/windows.py): when `window_form(t)` says t is
`whole[start:stop]` along a dim, slicing `whole` there must give t's value; where the ops do not
let a window through, it says nothing."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import TermTable, sort_map
from equivci.terms.semantics import evaluate
from equivci.terms.spec import DotSpec, ReduceSpec, bcast_spec
from equivci.translate.evaluator import Evaluator
from equivci.translate.windows import window_form

RNG = np.random.default_rng(5)
H = RNG.standard_normal((3, 4)).astype(np.float32)
W = RNG.standard_normal((4, 10)).astype(np.float32)
M = RNG.standard_normal((3,)).astype(np.float32)
PARAMS = {0: H, 1: W, 2: M}


def _setup():
    ev = Evaluator(None, TermTable(), 1)  # type: ignore[arg-type]  # no module: terms only
    h, w, m = (ev.table.make("param", (k,), (), v.shape, "f32") for k, v in PARAMS.items())
    return ev, h, w, m


def _holds(ev, t) -> None:
    """window_form(t) is a window whose value is t's."""
    found = window_form(ev, t)
    assert found is not None
    part = ev.slice_term(found.whole, found.dim, found.start, found.stop)
    np.testing.assert_allclose(evaluate(part, PARAMS, ev.values), evaluate(t, PARAMS, ev.values), rtol=1e-6)
    return found


def _logits(ev, h, w, m, start=2, stop=7):
    """dot(h, W[:, start:stop]) - bcast(m): logits of a vocabulary shard, less a per-row constant."""
    shard = ev.slice_term(w, 1, start, stop)
    spec = DotSpec((), (), (1,), (0,), 2, 2, ("f32", "f32")).text()
    logits = ev.mk("dot", (spec,), (h, shard), Shape("f32", (3, stop - start)))
    row = ev.mk("bcast", (bcast_spec(1, (3, stop - start), (0,)),), (m,), Shape("f32", (3, stop - start)))
    return ev.mk("binary", ("subtract",), (logits, row), Shape("f32", (3, stop - start)))


def test_a_window_passes_a_dot_a_row_constant_a_unary_op_and_a_constant_factor():
    ev, h, w, m = _setup()
    shifted = _logits(ev, h, w, m)
    found = _holds(ev, shifted)
    assert (found.dim, found.start, found.stop, found.whole.shape) == (1, 2, 7, (3, 10))
    exp = ev.mk("unary", ("exponential",), (shifted,), Shape("f32", shifted.shape))
    _holds(ev, exp)
    scaled = ev.scaled(exp, Fraction(1, 4))
    assert scaled is not None and scaled is not exp
    assert _holds(ev, scaled).whole.shape == (3, 10)


def test_a_window_moves_with_a_transpose_and_a_broadcast():
    ev, h, w, m = _setup()
    shifted = _logits(ev, h, w, m)
    moved = ev.mk("transpose", ("1,0",), (shifted,), Shape("f32", (5, 3)))
    assert _holds(ev, moved).dim == 0
    spread = ev.mk("bcast", (bcast_spec(2, (2, 5, 3), (1, 2)),), (moved,), Shape("f32", (2, 5, 3)))
    assert _holds(ev, spread).dim == 1


def test_near_miss_windows_of_different_ranges_are_no_window():
    ev, h, w, m = _setup()
    a, b = _logits(ev, h, w, m, 2, 7), _logits(ev, h, w, m, 3, 8)
    assert window_form(ev, ev.mk("binary", ("add",), (a, b), Shape("f32", a.shape))) is None


def test_near_miss_a_chain_deeper_than_the_budget_is_no_window():
    ev, h, w, m = _setup()
    t = ev.slice_term(w, 1, 2, 7)
    for _ in range(ev.budgets.window_depth):
        t = ev.mk("unary", ("negate",), (t,), Shape("f32", t.shape))
    assert window_form(ev, t) is not None
    t = ev.mk("unary", ("negate",), (t,), Shape("f32", t.shape))
    assert window_form(ev, t) is None


def _sorted_rows(ev, a, b):
    """A stable sort of (a, b) along dim 0, its first output: an aligned map along dim 1."""
    key = sort_map(2, 0, a.shape[0]).key("sort:GT:0:0")
    return ev.mk("aligned", (key,), (a, b), Shape("f32", a.shape))


def test_a_window_passes_a_reduce_over_other_dims_and_an_aligned_map():
    ev, h, w, m = _setup()
    shifted = _logits(ev, h, w, m)
    total = ev.mk("reduce", ("add", ReduceSpec(2, (0,)).text()), (shifted,), Shape("f32", (5,)))
    assert (_holds(ev, total).dim, _holds(ev, total).start) == (0, 2)
    assert _holds(ev, _sorted_rows(ev, shifted, shifted)).dim == 1


def test_near_miss_a_reduce_over_the_window_dim_is_no_window():
    ev, h, w, m = _setup()
    shifted = _logits(ev, h, w, m)
    assert window_form(ev, ev.mk("reduce", ("add", ReduceSpec(2, (1,)).text()), (shifted,), Shape("f32", (3,)))) is None


def test_near_miss_an_aligned_map_of_windows_of_different_ranges_is_no_window():
    ev, h, w, m = _setup()
    assert window_form(ev, _sorted_rows(ev, _logits(ev, h, w, m, 2, 7), _logits(ev, h, w, m, 3, 8))) is None
