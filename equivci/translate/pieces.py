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

The fact itself is stated beside every elementwise binary op with an operand concatenated along a
dim (or broadcast from one, or itself an op stated so): op(x, y) = concat(op(x[c_i:c_(i+1)],
y[c_i:c_(i+1)]), ...) between the cuts c_i of all operands. Rotary embeddings meet there whatever way they
write the half rotation: x * concat(cos, cos) + concat(-x2, x1) * concat(sin, sin) (NeoX's
rotate_half), concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin) (by halves), and roll(x, h) *
concat(-sin, sin) (a roll is the concatenation of its two windows) are all the concatenation of
the halves' signed sums (equivci.translate.signed_sums puts a negated factor of a product in front).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import BcastSpec
from equivci.translate.builder import Builder

# An op is cut into at most this many pieces: a rotary half rotation is 2 (3 with pass-through dims).
MAX_PIECES = 4


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


def elementwise_pieces(ev: Builder, args: list[Term], build: Callable[[list[Term]], Term]) -> Term | None:
    """The elementwise op of `args` as the concatenation of `build` (the op) on their windows
    between the cuts of the first dim along which an operand is cut (a concatenation, a broadcast
    of one, or an op stated so before); None when none is, or past MAX_PIECES pieces."""
    shape = args[0].shape
    for dim in range(len(shape)):
        cuts = sorted({c for a in args for c in _cuts(ev, a, dim)})
        if not cuts:
            continue
        if len(cuts) >= MAX_PIECES:
            return None
        bounds = [0, *cuts, shape[dim]]
        parts = [build([window(ev, a, dim, lo, hi) for a in args]) for lo, hi in zip(bounds, bounds[1:])]
        return ev.concat(parts, dim)
    return None


def _cuts(ev: Builder, t: Term, dim: int) -> list[int]:
    """The offsets strictly inside `dim` where `t` is cut into pieces."""
    t = ev.piecewise.get(t, t)
    if t.op == "bcast" and ev.folded(t) is None:
        kind, k = BcastSpec.parse(t.attrs[0]).parts[dim]
        return _cuts(ev, t.args[0], k) if kind == "i" else []
    if t.op != "concat" or t.attrs[0] != dim:
        return []
    sizes = np.cumsum([p.shape[dim] for p in parts_along(t, dim)])
    return [int(c) for c in sizes[:-1]]


def window(ev: Builder, t: Term, dim: int, start: int, stop: int) -> Term:
    """t[start:stop] along `dim`, read from t's pieces: a broadcast's window is the broadcast of
    its operand's window."""
    t = ev.piecewise.get(t, t)
    if t.op == "bcast" and ev.folded(t) is None:
        kind, k = BcastSpec.parse(t.attrs[0]).parts[dim]
        if kind == "i":
            shape = list(t.shape)
            shape[dim] = stop - start
            # a constant factor of the window goes in front, as broadcast_term puts it (a signed
            # sin, concat(-sin, sin), broadcast over the heads)
            inner = window(ev, t.args[0], k, start, stop)
            factor, base = ev.scale_of(inner)
            out = Shape(t.dtype, tuple(shape))
            scaled = ev.scaled(ev.normal("bcast", t.attrs, [base], out), factor)
            return scaled if scaled is not None else ev.normal("bcast", t.attrs, [inner], out)
    return ev.slice_term(t, dim, start, stop)
