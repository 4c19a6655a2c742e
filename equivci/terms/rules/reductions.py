"""Reductions: slices of kept dims pass through; reductions of adjacent windows of a reduced dim merge."""

from __future__ import annotations

from egglog import eq, union

from equivci.terms.language import T, a, b, c, e, k, key, o, op, reduce_in, reduce_out, reduced, x
from equivci.terms.rules.registry import family, named

REDUCER_OF = {"add": "add", "maximum": "maximum", "minimum": "minimum"}

REDUCTIONS = family(
    "reductions",
    named(
        "reductions/lift",
        "reduce(x[a:b along a kept dim]) = reduce(x)[a:b along its output dim]",
        eq(e).to(T.reduce(op, key, x.slice(k, a, b))),
        eq(o).to(reduce_out(key, k)),
    ).then(union(e).with_(T.reduce(op, key, x).slice(o, a, b))),
    named(
        "reductions/push",
        "reduce(x)[a:b] = reduce(x[a:b along the kept dim it comes from])",
        eq(e).to(T.reduce(op, key, x).slice(o, a, b)),
        eq(k).to(reduce_in(key, o)),
    ).then(union(e).with_(T.reduce(op, key, x.slice(k, a, b)))),
    *[
        named(
            f"reductions/merge_{r}",
            f"{r}(reduce_{r}(x[a:b]), reduce_{r}(x[b:c])) = reduce_{r}(x[a:c]) along a reduced dim",
            eq(e).to(T.binary(r, T.reduce(r, key, x.slice(k, a, b)), T.reduce(r, key, x.slice(k, b, c)))),
            reduced(key, k),
        ).then(union(e).with_(T.reduce(r, key, x.slice(k, a, c))))
        for r in REDUCER_OF
    ],
)
