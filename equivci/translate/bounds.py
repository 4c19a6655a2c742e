"""Integer bounds of index values, which fold range checks (a gather's index validation, a vocab
shard's `ids >= lo`): what a select narrows, which inputs the reference uses as indices, and the
comparisons the bounds decide.
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.spec import parse_compare
from equivci.translate import masks
from equivci.translate.builder import Builder

# Ops whose elements are elements of their first operand.
BOUND_PRESERVING = {"reshape", "bitcast", "broadcast", "slice", "dynamic-slice", "transpose", "copy", "convert"}


# Integer ops whose result's range follows from the ends of its operands' ranges.
AFFINE = {"add", "subtract", "multiply"}


def note(ev: Builder, inst: Instruction, args: list, result) -> None:
    """Bounds of an op's result from its operands': a layout op keeps its operand's, a select
    those of its branches, a clamp to constants its ends, a sum, difference or product the
    interval arithmetic of its operands' (a slice start `start + axis_index * rows`)."""
    if isinstance(result, Term) and inst.opcode in BOUND_PRESERVING and result not in ev.bounds:
        ev.bound(result, *[a for a in args[:1] if isinstance(a, Term)])
    if isinstance(result, Term) and inst.opcode in AFFINE and len(args) == 2 and result not in ev.bounds:
        bound_affine(ev, result, inst.opcode, *args)
    if isinstance(result, Term) and inst.opcode == "select" and len(args) == 3 and result not in ev.bounds:
        bound_select(ev, result, *args)
    if isinstance(result, Term) and inst.opcode in ("clamp", "minimum", "maximum") and result not in ev.bounds:
        # clamp(lo, x, hi) = min(max(x, lo), hi) lies in [lo, hi], whatever x
        if (clamped := masks.clamp_form(ev, result)) is not None:
            ev._set_bounds(result, clamped[0], clamped[2])


def bound_affine(ev: Builder, term: Term, op: str, a: Term, b: Term) -> None:
    """[lo_a, hi_a] op [lo_b, hi_b] over the integers: the sum and difference of intervals, and for
    a product the least and greatest product of their ends. `_set_bounds` keeps them only where the
    result's dtype holds the whole interval, so no element wrapped around."""
    found = [ev.bounds_of(a), ev.bounds_of(b)]
    if any(r is None or not np.all(np.isfinite(r)) for r in found) or term.dtype[0] not in "su":
        return
    ra, rb = [(int(r[0]), int(r[1])) for r in found if r is not None]  # exact, however large
    if op == "add":
        ev._set_bounds(term, ra[0] + rb[0], ra[1] + rb[1])
    elif op == "subtract":
        ev._set_bounds(term, ra[0] - rb[1], ra[1] - rb[0])
    else:
        ends = [x * y for x in ra for y in rb]
        ev._set_bounds(term, min(ends), max(ends))


def bound_select(ev: Builder, term: Term, p: Term, a: Term, b: Term) -> None:
    """select(p, a, b)'s elements are a's where p holds, b's where it fails: a range test of a
    branch's own ids narrows it (where(ids in [lo, hi), ids - lo, 0) is in [0, hi - lo), and so is
    where(ids outside [lo, hi), 0, ids - lo))."""
    chosen = masks.bounds_under_mask(ev, p, a) or ev.bounds_of(a)
    other = masks.bounds_under_mask(ev, p, b, outside=True) or ev.bounds_of(b)
    if chosen is not None and other is not None:
        ev._set_bounds(term, min(chosen[0], other[0]), max(chosen[1], other[1]))


def index_domains(ev: Builder) -> dict[Term, tuple[tuple[float, float], tuple[Instruction, ...]]]:
    """The entry parameters this program uses as gather indices (as they are, or with negative
    ones wrapped, as numpy indexing does), each with the valid indices [0, size - 1] (the
    smallest such range) and the gather that gives it (with its calls)."""
    domains: dict[Term, tuple[tuple[float, float], tuple[Instruction, ...]]] = {}
    for idx, size, inst in ev.index_uses:
        p, offsets = offset_input(ev, unwrapped_index(ev, idx, size))
        if p.op != "param" or p.dtype[0] not in "su":
            continue
        # p + c indexes [0, size) for every constant offset c: p in [-min c, size - 1 - max c];
        # several uses: every one of them valid (the gather that narrows the range is named)
        lo, hi = float(-offsets.min()), float(size - 1 - offsets.max())
        if p in domains:
            (was_lo, was_hi), was = domains[p]
            narrower = lo > was_lo or hi < was_hi
            lo, hi, inst = max(lo, was_lo), min(hi, was_hi), inst if narrower else was
        if lo <= hi:
            domains[p] = ((lo, hi), inst)
        else:  # no value makes every use valid: nothing is assumed
            domains.pop(p, None)
    return domains


def offset_input(ev: Builder, idx: Term) -> tuple[Term, np.ndarray]:
    """`idx` as p + c, with c a constant array and p a scalar broadcast (positions `start +
    arange(n)`, a window `pos - 3 + arange(4)`), or p itself (c = 0). Constants added or subtracted
    at every level are summed elementwise: HLO's elementwise ops take operands of one shape, and
    a scalar's broadcast adds the same to every element, so c is exact, not a bound. Only a scalar
    p is offset (a position or a start): an array of ids `ids + 1` would narrow every id of the
    vocabulary by what one lookup reads, so it stays an index of its own."""
    whole, offsets = idx, np.zeros(1, dtype=np.int64)
    while True:
        if idx.op == "bcast" and idx.args[0].shape == ():
            idx = idx.args[0]
            continue
        if idx.op == "binary" and idx.attrs in (("add",), ("subtract",)):
            sign = 1 if idx.attrs == ("add",) else -1
            sides = (0, 1) if sign == 1 else (0,)  # c - p is not p plus a constant
            peeled = next(
                ((idx.args[k], c.astype(np.int64)) for k in sides if (c := ev.folded(idx.args[1 - k])) is not None),
                None,
            )
            if peeled is not None and peeled[1].size:
                idx, c = peeled
                offsets = offsets + sign * c
                continue
        return (idx, offsets) if idx.shape == () else (whole, np.zeros(1, dtype=np.int64))


def unwrapped_index(ev: Builder, idx: Term, size: int) -> Term:
    """`idx` without reshapes and without the wrap select(i < 0, i + size, i) of negative indices."""
    while idx.op == "reshape":
        idx = idx.args[0]
    if idx.op == "ternary" and idx.attrs == ("select",):
        test, wrapped, i = idx.args
        if (
            test.op == "binary"
            and (parse_compare(test.attrs[0]) or ("",))[0] == "LT"
            and test.args[0] is i
            and masks.scalar_int(ev, test.args[1]) == 0
            and wrapped.op == "binary"
            and wrapped.attrs == ("add",)
            and wrapped.args[0] is i
            and masks.scalar_int(ev, wrapped.args[1]) == size
        ):
            return unwrapped_index(ev, i, size)
    return idx


def decide(ev: Builder, direction: str, a: Term, b: Term, shape: Shape) -> Term | None:
    """A comparison that the bounds of its operands decide, as a constant."""
    ra, rb = ev.bounds_of(a), ev.bounds_of(b)
    if ra is None or rb is None:
        return None
    always = {
        "LT": ra[1] < rb[0],
        "LE": ra[1] <= rb[0],
        "GT": ra[0] > rb[1],
        "GE": ra[0] >= rb[1],
        "EQ": ra[0] == ra[1] == rb[0] == rb[1],
        "NE": ra[1] < rb[0] or ra[0] > rb[1],
    }
    never = {
        "LT": ra[0] >= rb[1],
        "LE": ra[0] > rb[1],
        "GT": ra[1] <= rb[0],
        "GE": ra[1] < rb[0],
        "EQ": ra[1] < rb[0] or ra[0] > rb[1],
        "NE": ra[0] == ra[1] == rb[0] == rb[1],
    }
    if direction not in always or not (always[direction] or never[direction]):
        return None
    return ev.const(np.full(shape.dims, always[direction], dtype=np.bool_), shape.dtype)
