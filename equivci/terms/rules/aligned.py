"""Aligned maps (variadic reduces, batched gathers): slices of aligned dims pass through."""

from __future__ import annotations

from egglog import eq, union

from equivci.terms.language import T, a, aligned_lhs, aligned_rhs, aligned_rhs_alone, b, dim, e, j, k, key, o, x, y
from equivci.terms.rules.registry import family, named

ALIGNED = family(
    "aligned",
    named(
        "aligned/lift",
        "f(x[a:b], y[a:b] along dims aligned to one output dim) = f(x, y)[a:b there]",
        eq(e).to(T.aligned(key, x.slice(k, a, b), y.slice(j, a, b))),
        eq(o).to(aligned_lhs(key, k)),
        eq(o).to(aligned_rhs(key, j)),
        eq(dim(x, k)).to(dim(y, j)),
    ).then(union(e).with_(T.aligned(key, x, y).slice(o, a, b))),
    # A gather's rows along an index dim depend only on the indices there (the operand is read
    # whole): a shard of the ids looks up the shard of the reference's rows.
    named(
        "aligned/rhs_lift",
        "f(x, y[a:b along an rhs dim no lhs dim is aligned with]) = f(x, y)[a:b there]",
        eq(e).to(T.aligned(key, x, y.slice(j, a, b))),
        eq(o).to(aligned_rhs_alone(key, j)),
    ).then(union(e).with_(T.aligned(key, x, y).slice(o, a, b))),
)
