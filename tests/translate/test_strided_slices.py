"""Strided slices as windows of the operand with the dim split by the step (translate/shapes.py: strided_slice),
checked against numpy's x[start:stop:step] through the terms' numpy semantics."""

from __future__ import annotations

import numpy as np
import pytest

from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator
from equivci.translate.shapes import strided_slice


def _evaluator() -> Evaluator:
    return Evaluator(None, TermTable(), 1)  # type: ignore[arg-type]  # no module: terms only


@pytest.mark.parametrize("shape, dim, start, stop, step", [
    ((2, 3, 8), 2, 1, 8, 2), ((2, 3, 8), 2, 0, 8, 2), ((2, 12, 3), 1, 2, 11, 3), ((6, 4), 0, 1, 5, 2),
    ((9, 2), 0, 0, 9, 3), ((8,), 0, 3, 8, 4), ((8,), 0, 5, 6, 2),
])
def test_strided_slice_is_numpys(shape, dim, start, stop, step):
    ev = _evaluator()
    x = ev.table.make("param", (0,), (), shape, "f32")
    term = strided_slice(ev, x, dim, start, stop, step)
    value = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    index = [slice(None)] * len(shape)
    index[dim] = slice(start, stop, step)
    assert np.array_equal(evaluate(term, {0: value}), value[tuple(index)])


def test_near_miss_a_step_that_does_not_divide_the_dim_stays_unmodelled():
    ev = _evaluator()
    assert strided_slice(ev, ev.table.make("param", (0,), (), (7,), "f32"), 0, 0, 7, 2) is None
