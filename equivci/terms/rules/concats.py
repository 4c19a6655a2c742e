"""Concatenation: adjacent windows merge, and slices of a concatenation pick from its parts."""

from __future__ import annotations

from egglog import eq, ne, union

from equivci.terms.language import T, a, b, c, concat_windows, d, d2, dim, e, g, k, n, w, x, y, z
from equivci.terms.rules.registry import family, named

CONCATS = family(
    "concats",
    named(
        "concats/merge", "concat(x[a:b], x[b:c]; d) = x[a:c]", eq(e).to(T.concat(x.slice(d, a, b), x.slice(d, b, c), d))
    ).then(union(e).with_(x.slice(d, a, c))),
    named(
        "concats/slice_left",
        "concat(x, y; d)[a:b] = x[a:b] for b <= dim(x, d)",
        eq(e).to(T.concat(x, y, d).slice(d, a, b)),
        eq(n).to(dim(x, d)),
        b <= n,
    ).then(union(e).with_(x.slice(d, a, b))),
    named(
        "concats/slice_right",
        "concat(x, y; d)[a:b] = y[a-n : b-n] for a >= n = dim(x, d)",
        eq(e).to(T.concat(x, y, d).slice(d, a, b)),
        eq(n).to(dim(x, d)),
        a >= n,
    ).then(union(e).with_(y.slice(d, a - n, b - n))),
    named(
        "concats/slice_straddle",
        "concat(x, y; d)[a:b] = concat(x[a:n], y[0:b-n]; d) for a < n = dim(x, d) < b",
        eq(e).to(T.concat(x, y, d).slice(d, a, b)),
        eq(n).to(dim(x, d)),
        a < n,
        b > n,
    ).then(union(e).with_(T.concat(x.slice(d, a, n), y.slice(d, 0, b - n), d))),
    named(
        "concats/slice_other_dim",
        "concat(x, y; d)[a:b along k] = concat(x[a:b], y[a:b]; d) for k != d",
        eq(e).to(T.concat(x, y, d).slice(k, a, b)),
        ne(k).to(d),
    ).then(union(e).with_(T.concat(x.slice(k, a, b), y.slice(k, a, b), d))),
    named(
        "concats/lift",
        "concat(x[a:b along k], y[a:b along k]; d) = concat(x, y; d)[a:b along k] for k != d",
        eq(e).to(T.concat(x.slice(k, a, b), y.slice(k, a, b), d)),
        ne(k).to(d),
        eq(dim(x, k)).to(dim(y, k)),
    ).then(union(e).with_(T.concat(x, y, d).slice(k, a, b))),
    # The same when each part is also a window along d itself (rotate_half on a device's heads:
    # concat(-q[heads][..., h:], q[heads][..., :h])): canonical slice order keeps the window
    # along the lower dim k inside the one along d, out of reach of the rule above. Read from the
    # existing concatenation (the reference's) and only at windows its part x already has: from
    # the device's side it matched every pair of the parts' slice chains, and a training step's
    # backward pass has so many that one iteration took minutes and gigabytes. The concatenations of
    # windows are recorded once (a seed), so that the search starts from them.
    named(
        "concats/lift_nested",
        "concat(x[c:g], y[c2:g2]; d)[a:b along k] = "
        "concat(x[a:b along k][c:g along d], y[a:b along k][c2:g2 along d]; d) for k != d",
        concat_windows(z, x, y, d, c, g, n, d2),
        eq(w).to(x.slice(k, a, b)),
        ne(k).to(d),
        eq(dim(x, k)).to(dim(y, k)),
    )
    .seeded(concat_windows(z, x, y, d, c, g, n, d2), eq(z).to(T.concat(x.slice(d, c, g), y.slice(d, n, d2), d)))
    .then(union(z.slice(k, a, b)).with_(T.concat(w.slice(d, c, g), y.slice(k, a, b).slice(d, n, d2), d))),
)
