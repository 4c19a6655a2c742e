"""A select whose predicate is a constant, as windows of its branches (elementwise's select and the
reductions' masked sums both read it)."""

from __future__ import annotations

import numpy as np

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
