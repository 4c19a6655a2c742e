"""Sums of concatenations as concatenations of sums.

An elementwise op acts on each element alone, so on two concatenations split at the same places it
is the concatenation of the op on the pieces: concat(a1, b1) + concat(a2, b2) = concat(a1 + a2,
b1 + b2). Two forms of it are normal forms here, in both programs alike:

* pieces padded with zeros to one shape and added (the gradient of a flat parameter vector's
  unpacking: one pad per piece) are the concatenation of the pieces, concat(a, 0) + concat(0, b) =
  concat(a, b), when no two non-zero pieces overlap;
* an all-reduce of values concatenated alike (each device's packed gradient, its microbatches'
  losses stacked) is the concatenation of the all-reduced pieces, so the sum over devices meets
  the reference's sum of each piece over its rows.

A constant factor shared by the operands stays in front (equivci.translate.builder).
"""

from __future__ import annotations

import numpy as np

from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.translate.builder import Builder


def parts_along(x: Term, dim: int) -> list[Term]:
    """The operands of nested concatenations along `dim`, in order (x itself when it is none)."""
    if x.op == "concat" and x.attrs[0] == dim:
        return [p for arg in x.args for p in parts_along(arg, dim)]
    return [x]


def padded_sum(ev: Builder, a: Term, b: Term) -> Term | None:
    """a + b as one concatenation of their non-zero pieces when both are concatenations along one
    dim whose non-zero pieces do not overlap (zeros elsewhere); None otherwise."""
    (fa, a), (fb, b) = ev.scale_of(a), ev.scale_of(b)
    if a.op != "concat" or b.op != "concat" or a.attrs[0] != b.attrs[0] or a.shape != b.shape or a.dtype != b.dtype:
        return None
    dim = a.attrs[0]
    held: list[tuple[int, int, Term]] = []
    for side, factor in ((a, fa), (b, fb)):
        start = 0
        for piece in parts_along(side, dim):
            stop = start + piece.shape[dim]
            if ev.uniform(piece) != 0:
                scaled = ev.scaled(piece, factor)
                if scaled is None:
                    return None
                held.append((start, stop, scaled))
            start = stop
    held.sort(key=lambda item: item[0])
    if any(prev[1] > nxt[0] for prev, nxt in zip(held, held[1:])):
        return None
    out, at = [], 0
    for start, stop, term in held:
        if start > at:
            out.append(_zeros(ev, a, dim, start - at))
        out.append(term)
        at = stop
    if at < a.shape[dim]:
        out.append(_zeros(ev, a, dim, a.shape[dim] - at))
    return ev.concat(out, dim)


def split_alike(ev: Builder, members: list[Term]) -> tuple[int, list[list[Term]]] | None:
    """(dim, the members' pieces position by position) when every member is a concatenation along
    `dim` cut at the same places; None otherwise."""
    if len(members) < 2 or any(m.op != "concat" for m in members):
        return None
    dim = members[0].attrs[0]
    cut = [parts_along(m, dim) for m in members]
    sizes = [p.shape[dim] for p in cut[0]]
    if any(m.attrs[0] != dim or [p.shape[dim] for p in parts] != sizes for m, parts in zip(members, cut)):
        return None
    return dim, [list(column) for column in zip(*cut)]


def _zeros(ev: Builder, like: Term, dim: int, size: int) -> Term:
    shape = list(like.shape)
    shape[dim] = size
    return ev.const(np.zeros(shape, NP_DTYPES.get(like.dtype, np.float32)), like.dtype)
