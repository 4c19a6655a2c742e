"""A select whose predicate is a constant, as windows of its branches (elementwise's select and the
reductions' masked sums both read it), and a product by a constant mask as that select."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.translate.arrays import all_equal
from equivci.translate.builder import Builder


def select_by_constant(ev: Builder, p: Term, a: Term, b: Term) -> Term | None:
    """select(p, a, b) with p a constant is one of its branches where p is the same everywhere,
    and the concatenation of windows of both where p changes along one dim only, in at most
    `budgets.select_runs` runs (the last shard of a padded buffer, its padding masked off)."""
    value = ev.folded(p)
    if value is None or not value.size:
        return None
    if all_equal(value):
        return a if bool(value.flat[0]) else b
    varying = [d for d in range(value.ndim) if not np.all(value == np.take(value, [0], axis=d))]
    if len(varying) != 1:
        return None
    dim = varying[0]
    line = value[tuple(slice(None) if d == dim else 0 for d in range(value.ndim))].astype(bool)
    seams = [0, *(int(k) + 1 for k in np.flatnonzero(line[1:] != line[:-1])), len(line)]
    if len(seams) - 1 > ev.budgets.select_runs:
        return None
    parts = [ev.slice_term(a if line[lo] else b, dim, lo, hi) for lo, hi in zip(seams, seams[1:])]
    return ev.concat(parts, dim)


def product_by_mask(ev: Builder, x: Term, m: Term, both_orders: bool = False) -> Term | None:
    """x * m (`both_orders`: or m * x) for m a constant of ones and zeros that changes along one dim, as select(m == 1, x, 0):
    the windows of x where m is 1 and zeros where it is 0 (x * 1 = x and x * 0 = 0 over the reals,
    exact on integers). A device's count placed in its own slot by a one-hot, `one_hot(me, n) *
    count`, is then its count padded with zeros, which a psum over the devices concatenates
    (collectives._padded_pieces). None where m or x is not of that kind."""
    if both_orders:
        return product_by_mask(ev, x, m) or product_by_mask(ev, m, x)
    value = ev.folded(m)
    if value is None or not value.size or ev.folded(x) is not None or x.dtype == "pred":
        return None
    if all_equal(value) or not np.all((value == 0) | (value == 1)):
        return None
    zeros = ev.splat(Fraction(0), Shape(x.dtype, x.shape))
    return None if zeros is None else select_by_constant(ev, ev.const(value == 1, "pred"), x, zeros)
