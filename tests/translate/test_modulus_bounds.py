"""Bounds of integer index arithmetic on a position (translate/bounds.py):

    x rem c  in [1 - |c|, |c| - 1]    (HLO's truncated remainder, the sign of x; [0, |c| - 1] for x >= 0)
    x & c    in [0, c]                 (c >= 0: the result's bits are some of c's)
    f(v)     in [min, max] of f over v's bounds, for f elementwise in one bounded v and constants

so that jnp's floor modulus `pos % W` (a select on the truncated remainder) is in [0, W) and the
wrap of a negative index `where(s < 0, s + W, s)` of it folds to s. Each bound is exact here (the
enumeration narrows what interval arithmetic gives) and checked against XLA on extreme inputs.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from one_device import programs as _programs

POS = np.array([0, 1, 3, 4, 7, 9, -1, -4, -9, 2**31 - 1, -(2**31)], np.int32)


def _rem(p):
    return lax.rem(p, 4)


CASES = {
    "truncated-remainder": (_rem, (-3, 3)),
    "floor-modulus": (lambda p: p % 4, (0, 3)),
    "floor-modulus-negative-divisor": (lambda p: p % -4, (-3, 0)),
    "bitwise-and": (lambda p: p & 7, (0, 7)),
    "wrapped-remainder": (lambda p: jnp.where(_rem(p) < 0, _rem(p) + 4, _rem(p)), (0, 3)),
    "scaled-select": (lambda p: jnp.where(_rem(p) < 0, -1, _rem(p) * 5), (-1, 15)),
    "shifted-modulus": (lambda p: p % 4 - 2, (-2, 1)),
}


@pytest.mark.parametrize("case", CASES)
def test_bounds_of_a_modulus_are_exact_and_hold_what_xla_computes(case) -> None:
    fn, want = CASES[case]
    programs, computed, _ = _programs(fn, (POS,))
    out = programs.reference_outputs[0]
    assert programs.evaluator.bounds_of(out) == want
    assert want[0] <= computed.min() and computed.max() <= want[1]


def test_a_remainder_by_zero_has_no_bounds_of_its_own() -> None:
    """x rem 0 is x on XLA's CPU: nothing bounds it."""
    programs, _, _ = _programs(lambda p: lax.rem(p, np.int32(0)), (POS,))
    assert programs.evaluator.bounds_of(programs.reference_outputs[0]) is None
