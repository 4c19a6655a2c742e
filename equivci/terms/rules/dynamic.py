"""Dynamic slices and updates: slices of the other dims pass through (the clamped start depends only
on the sizes along the dynamic dim), so a device's window of a stacked weight or of a per-layer
output buffer is the window of the reference's at the same counter."""

from __future__ import annotations

from egglog import eq, ne, union

from equivci.terms.language import T, a, b, d, dim, e, k, n, x, y, z
from equivci.terms.rules.registry import family, named

DYNAMIC = family(
    "dynamic",
    named(
        "dynamic/dslice_lift",
        "dslice(x[a:b along k], start; d) = dslice(x, start; d)[a:b along k] for k != d",
        eq(e).to(T.dslice(d, n, x.slice(k, a, b), y)),
        ne(k).to(d),
    ).then(union(e).with_(T.dslice(d, n, x, y).slice(k, a, b))),
    named(
        "dynamic/dupdate_lift",
        "dupdate(x[a:b], u[a:b] along k, start; d) = dupdate(x, u, start; d)[a:b along k] for k != d",
        eq(e).to(T.dupdate(d, x.slice(k, a, b), y.slice(k, a, b), z)),
        ne(k).to(d),
        eq(dim(x, k)).to(dim(y, k)),
    ).then(union(e).with_(T.dupdate(d, x, y, z).slice(k, a, b))),
)
