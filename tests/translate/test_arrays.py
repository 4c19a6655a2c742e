"""Checks on folded constants cost what their distinct elements cost, not what their shape holds: a
scale factor broadcast to a weight's or the logits' shape (a training step's gradients at 8B
shapes: billions of elements) is a view of one number."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from equivci.terms.ir import TermTable
from equivci.translate.arrays import all_equal, distinct
from equivci.translate.builder import Builder

HUGE = (1 << 20, 1 << 20)  # 2**40 elements: a check that materializes them runs out of memory


def test_a_broadcast_is_checked_on_its_distinct_elements():
    scalar = np.broadcast_to(np.float32(0.5), HUGE)
    assert distinct(scalar).size == 1 and all_equal(scalar)
    rows = np.broadcast_to(np.arange(4.0)[:, None], (4, 1 << 30))
    assert distinct(rows).shape == (4, 1) and not all_equal(rows)


def test_near_misses_of_uniform_are_not_uniform():
    one_off = np.full((3, 5), 2.0)
    one_off[2, 4] = 2.0000002
    assert not all_equal(one_off) and not all_equal(np.broadcast_to(one_off, (7, 3, 5)))
    assert not all_equal(np.broadcast_to(np.array([1.0, np.nan]), (9, 2)))
    assert all_equal(np.broadcast_to(np.array([np.nan]), (9, 2)))  # NaN fills count as equal
    assert not all_equal(np.zeros((0, 3)))


def test_scale_factors_of_huge_shapes_are_pulled_out_cheaply():
    builder = Builder(None, TermTable(), 1)
    base = builder.table.make("param", (0,), (), HUGE, "f32")
    scaled = builder.scaled(base, Fraction(1, 4))
    assert scaled is not None and builder.scale_of(scaled) == (Fraction(1, 4), base)
    other = builder.const(np.broadcast_to(np.float32(3.0), HUGE), "f32")
    assert builder.uniform(other) == 3
    varying = builder.table.make("param", (1,), (), HUGE, "f32")
    builder.values[varying] = np.broadcast_to(np.arange(2, dtype=np.float32)[:, None], (2, 1 << 40))
    assert builder.uniform(varying) is None


def test_a_constant_of_one_value_is_held_as_a_view_of_that_value():
    """An activation-shaped splat built whole (an op's constant operand moved inside a reshape) is
    kept as a view of its one element: held whole, each stayed for the whole translation (fused_qkv
    at 405B: 6.8 GB). A constant of several values is held as it is."""
    builder = Builder(None, TermTable(), 1)
    splat = builder.const(np.full((64, 128, 128), 0.5, dtype=np.float32), "f32")
    held = builder.values[splat]
    assert held.strides == (0, 0, 0) and held.shape == (64, 128, 128) and held.dtype == np.float32
    assert held.flat[0] == 0.5
    table = np.arange(12.0).reshape(3, 4)
    assert np.array_equal(builder.values[builder.const(table, "f64")], table)
