"""dot_general: slices of free and batch dims pass through; a contraction split in two merges (also\nacross two sums that each hold one of the pieces)."""

from __future__ import annotations

from egglog import eq, union

from equivci.terms.language import (
    T,
    a,
    b,
    c,
    contraction_piece,
    dim,
    dot_batch,
    dot_batch_out,
    dot_contract,
    dot_lhs_out,
    dot_out_lhs,
    dot_out_rhs,
    dot_rhs_out,
    e,
    j,
    k,
    o,
    spec,
    w,
    x,
    y,
    z,
)
from equivci.terms.rules.registry import family, named


def _piece(lo, hi) -> T:
    """The dot of the operands' windows [lo, hi) along the contraction (k of x, j of y)."""
    return T.dot(spec, x.slice(k, lo, hi), y.slice(j, lo, hi))


DOTS = family(
    "dots",
    named(
        "dots/lhs_free_lift",
        "dot(x[a:b along a free dim], y) = dot(x, y)[a:b along its output dim]",
        eq(e).to(T.dot(spec, x.slice(k, a, b), y)),
        eq(o).to(dot_lhs_out(spec, k)),
    ).then(union(e).with_(T.dot(spec, x, y).slice(o, a, b))),
    named(
        "dots/rhs_free_lift",
        "dot(x, y[a:b along a free dim]) = dot(x, y)[a:b along its output dim]",
        eq(e).to(T.dot(spec, x, y.slice(k, a, b))),
        eq(o).to(dot_rhs_out(spec, k)),
    ).then(union(e).with_(T.dot(spec, x, y).slice(o, a, b))),
    named(
        "dots/lhs_free_push",
        "dot(x, y)[a:b along an lhs free dim] = dot(x[a:b], y)",
        eq(e).to(T.dot(spec, x, y).slice(o, a, b)),
        eq(k).to(dot_out_lhs(spec, o)),
    ).then(union(e).with_(T.dot(spec, x.slice(k, a, b), y))),
    named(
        "dots/rhs_free_push",
        "dot(x, y)[a:b along an rhs free dim] = dot(x, y[a:b])",
        eq(e).to(T.dot(spec, x, y).slice(o, a, b)),
        eq(k).to(dot_out_rhs(spec, o)),
    ).then(union(e).with_(T.dot(spec, x, y.slice(k, a, b)))),
    named(
        "dots/batch_lift",
        "dot(x[a:b], y[a:b] along a batch dim pair) = dot(x, y)[a:b along its output dim]",
        eq(e).to(T.dot(spec, x.slice(k, a, b), y.slice(j, a, b))),
        eq(j).to(dot_batch(spec, k)),
        eq(o).to(dot_batch_out(spec, k)),
        eq(dim(x, k)).to(dim(y, j)),
    ).then(union(e).with_(T.dot(spec, x, y).slice(o, a, b))),
    # Read from the pieces, each a dot of two windows recorded once: joined from the sum, the search
    # paired every form of one piece with every form of the other.
    named(
        "dots/contraction_merge",
        "dot(x[a:b], y[a:b]) + dot(x[b:c], y[b:c]) = dot(x[a:c], y[a:c]) along a contraction",
        eq(e).to(T.binary("add", z, w)),
        contraction_piece(spec, z, x, y, k, a, b),
        contraction_piece(spec, w, x, y, k, b, c),
        eq(j).to(dot_contract(spec, k)),
    )
    .seeded(contraction_piece(spec, z, x, y, k, a, b), eq(z).to(_piece(a, b)), eq(j).to(dot_contract(spec, k)))
    .then(union(e).with_(T.dot(spec, x.slice(k, a, c), y.slice(j, a, c)))),
    # Partial sums added in another order than their windows (a gradient reduce-scattered per
    # microbatch, then accumulated: (mb0 of device 0 + mb0 of device 1) + (mb1 of 0 + mb1 of 1)):
    # the pieces of adjacent windows are brought together, only where they merge into one dot.
    named(
        "dots/contraction_merge_across",
        "(dot(x[a:b], y[a:b]) + z) + (dot(x[b:c], y[b:c]) + w) = dot(x[a:c], y[a:c]) + (z + w) along a contraction",
        eq(e).to(T.binary("add", T.binary("add", _piece(a, b), z), T.binary("add", _piece(b, c), w))),
        eq(j).to(dot_contract(spec, k)),
    ).then(union(e).with_(T.binary("add", _piece(a, c), T.binary("add", z, w)))),
)
