"""Slices: composition, a canonical order of slices of different dims, full slices, and windows
re-based on wider reference windows."""

from __future__ import annotations

from egglog import eq, i64, ne, union

from equivci.terms.language import a, b, c, d, d2, dim, e, g, k, m, n, reference, w, x
from equivci.terms.rules.registry import family, named

SLICES = family(
    "slices",
    named("slices/compose", "x[a:b][c:g] = x[a+c : a+g] along one dim", eq(e).to(x.slice(d, a, b).slice(d, c, g))).then(
        union(e).with_(x.slice(d, a + c, a + g))
    ),
    # Slices of different dims commute; the canonical order has the higher dim outside. (Keeping
    # both orders lets push and lift rules multiply windows: a Llama layer stopped saturating.)
    named(
        "slices/reorder",
        "slices of different dims commute (the higher dim outside)",
        eq(e).to(x.slice(d, a, b).slice(d2, c, g)),
        d2 < d,
    ).then(union(e).with_(x.slice(d2, c, g).slice(d, a, b))),
    named(
        "slices/full", "x[0 : dim(x, d)] along d = x", eq(e).to(x.slice(d, a, b)), eq(a).to(i64(0)), eq(b).to(dim(x, d))
    ).then(union(e).with_(x)),
    # Re-base a slice on a wider slice of the same value that is a reference value (k from a fused
    # qkv is a window of the reference's k). Only onto reference values: re-basing onto every wider
    # slice multiplies the forms of each slice and, through the lifts, the terms of a layer.
    named(
        "slices/rebase",
        "x[a:b] = (x[c:g])[a-c : b-c] for c <= a <= b <= g, onto a reference value x[c:g]",
        eq(e).to(x.slice(d, a, b)),
        eq(w).to(x.slice(d, c, g)),
        reference(w),
        c <= a,
        b <= g,
        ne(w).to(e),
    ).then(union(e).with_(w.slice(d, a - c, b - c))),
    # The canonical order keeps the higher dim's window outside; a window along a lower dim of a
    # reference value that is itself a window (one head of q taken from a fused qkv by head_dim) is
    # then out of reach of the lifts that want it outside. Only onto reference values, as above.
    named(
        "slices/reorder_onto_reference",
        "x[a:b along d2][c:g along d] = (x[c:g along d])[a:b along d2] for d2 < d, onto a reference value x[c:g along d]",
        eq(e).to(x.slice(d2, a, b).slice(d, c, g)),
        d2 < d,
        eq(w).to(x.slice(d, c, g)),
        reference(w),
    ).then(union(e).with_(w.slice(d2, a, b))),
    # The same under windows along two lower dims (a device of a two-axis mesh holds its rows and
    # its experts of a top-k's sort; the reference's top-k values are a window of that sort along
    # the sorted dim): one step, since neither two-level reorder reaches a reference value alone.
    named(
        "slices/reorder_onto_reference_nested",
        "x[a:b along k][c:g along d2][n:m along d] = (x[n:m along d])[a:b along k][c:g along d2] for k < d2 < d, "
        "onto a reference value x[n:m along d]",
        eq(e).to(x.slice(k, a, b).slice(d2, c, g).slice(d, n, m)),
        k < d2,
        d2 < d,
        eq(w).to(x.slice(d, n, m)),
        reference(w),
    ).then(union(e).with_(w.slice(k, a, b).slice(d2, c, g))),
)
