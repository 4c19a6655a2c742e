"""Answers the translation keeps instead of computing again (asked 10^5 times at 405B shapes): each
is kept by exactly what it is computed from, so a changed input gives a fresh answer."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from equivci.terms.ir import TermTable
from equivci.terms.spec import reshape_spec
from equivci.translate.evaluator import Evaluator


def test_uniform_follows_the_constant_a_term_holds_not_the_term() -> None:
    ev = Evaluator(None, TermTable(), 1)
    t = ev.table.make("param", (0,), (), (4,), "f32")
    assert ev.uniform(t) is None  # not folded
    ev.values[t] = np.full((4,), 2.0, np.float32)
    assert ev.uniform(t) == Fraction(2)
    ev.values[t] = np.array([2.0, 2.0, 2.0, 3.0], np.float32)  # near miss: one element differs
    assert ev.uniform(t) is None
    ev.values[t] = np.broadcast_to(np.float32(0.5), (4,))
    assert ev.uniform(t) == Fraction(1, 2)
    ev.values[t] = np.full((4,), np.inf, np.float32)  # one number, not finite
    assert ev.uniform(t) is None


def test_the_same_array_under_two_terms_has_one_answer() -> None:
    ev = Evaluator(None, TermTable(), 1)
    a, b = (ev.table.make("param", (k,), (), (3,), "f32") for k in (0, 1))
    value = np.full((3,), 0.25, np.float32)
    ev.values[a] = ev.values[b] = value
    assert ev.uniform(a) == ev.uniform(b) == Fraction(1, 4)


def test_a_term_asked_for_again_is_the_same_object_and_other_arguments_another() -> None:
    table = TermTable()
    x, y = (table.make("param", (k,), (), (2,), "f32") for k in (0, 1))
    s = table.make("binary", ("add",), (x, y), [2], "f32")  # a list shape is the tuple's
    assert table.make("binary", ("add",), (x, y), (2,), "f32") is s
    assert table.make("binary", ("add",), (y, x), (2,), "f32") is not s
    assert table.make("binary", ("add",), (x, y), (2,), "bf16") is not s
    assert len(table) == 5


def test_reshape_specs_are_the_same_for_lists_and_tuples_and_differ_by_shape() -> None:
    assert reshape_spec([2, 3, 4], [6, 4]) == reshape_spec((2, 3, 4), (6, 4))
    assert reshape_spec((2, 3, 4), (6, 4)) != reshape_spec((2, 3, 4), (2, 12))
    assert reshape_spec((1, 8), (8,), singletons=True) != reshape_spec((1, 8), (8,))
    assert reshape_spec((2, 3), (5,)) is None
