"""Integer bounds of index values, which fold range checks (a gather's index validation, a vocab
shard's `ids >= lo`): what a select narrows, which inputs the reference uses as indices, and the
comparisons the bounds decide.
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import parse_compare
from equivci.translate import masks
from equivci.translate.builder import Builder

# Ops whose elements are elements of their first operand.
BOUND_PRESERVING = {"reshape", "bitcast", "broadcast", "slice", "dynamic-slice", "transpose", "copy", "convert"}


# Integer ops whose result's range follows from the ends of its operands' ranges.
AFFINE = {"add", "subtract", "multiply"}

# Elementwise integer ops whose result may be bounded by enumerating one bounded operand's values.
ENUMERATED = {"add", "subtract", "multiply", "remainder", "select", "and", "or", "xor", "maximum", "minimum"}


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
    if isinstance(result, Term) and inst.opcode in ("remainder", "and") and len(args) == 2 and result not in ev.bounds:
        bound_remainder(ev, result, inst.opcode, *args)
    if isinstance(result, Term) and inst.opcode in ENUMERATED and ev.folded(result) is None:
        bound_enumerated(ev, result)
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


def bound_remainder(ev: Builder, term: Term, op: str, x: Term, m: Term) -> None:
    """HLO's remainder by a constant c != 0 is truncated: |x rem c| <= |c| - 1, with the sign of x
    (so [0, |c| - 1] for x >= 0). x & c for a constant c >= 0 lies in [0, c] (two's complement: the
    result's bits are some of c's). A term's own ops only: `remainder(x, c)` and `x & c` as written."""
    c = ev.folded(m)
    if c is None or not c.size or term.dtype[0] not in "su" or not np.all(c == c.flat[0]):
        return
    k = int(c.flat[0])
    if op == "and":
        if k >= 0:
            ev._set_bounds(term, 0, k)
        return
    if k == 0:
        return  # (x rem 0 is x on XLA's CPU: no bound of its own)
    top = abs(k) - 1
    found = ev.bounds_of(x)
    lo = 0 if found is not None and found[0] >= 0 else -top
    hi = 0 if found is not None and found[1] <= 0 else top
    ev._set_bounds(term, lo, hi)


def bound_enumerated(ev: Builder, term: Term) -> None:
    """Bounds of an integer term computed elementwise from one bounded integer value v and
    constants, by evaluating it at every value v's bounds allow (at most `budgets.enumerated_values`):
    each element of the term is the same function of v's element at that index, so its values lie
    among those. jnp's floor modulus `where((r != 0) & ((r < 0) != (c < 0)), r + c, r)` of the
    truncated r = x rem c is in [0, c - 1] (r alone is in [1 - c, c - 1]), and a wrap of negative
    indices `where(i < 0, i + n, i)` of such an i is i itself. Narrows bounds found otherwise."""
    leaves: set[Term] = set()
    seen: dict[Term, bool] = {}

    def elementwise_of_bounded(t: Term) -> bool:
        if t in seen:
            return seen[t]
        if ev.folded(t) is not None:
            found = True
        else:
            # through the ops first (rem + c is a function of rem), a bounded value a leaf where
            # they end (rem = x rem c of an unbounded x)
            before = set(leaves)
            found = (
                t.op in ("binary", "ternary", "unary")
                and len(seen) < 64
                and all(a.shape == t.shape for a in t.args)
                and all(elementwise_of_bounded(a) for a in t.args)
            )
            if not found and t is not term and ev.bounds_of(t) is not None and t.dtype[0] in "su":
                leaves.intersection_update(before)
                leaves.add(t)
                found = True
        seen[t] = found
        return found

    if term.dtype[0] not in "su" or not elementwise_of_bounded(term) or len(leaves) != 1:
        return
    (leaf,) = leaves
    lo, hi = ev.bounds_of(leaf)  # type: ignore[misc]
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi - lo + 1 > ev.budgets.enumerated_values:
        return
    np_dtype = NP_DTYPES.get(leaf.dtype)
    if np_dtype is None:
        return
    values: np.ndarray = np.arange(int(lo), int(hi) + 1, dtype=np_dtype).reshape((-1,) + (1,) * len(leaf.shape))
    computed: dict[Term, np.ndarray] = {leaf: values}

    def value_of(t: Term) -> np.ndarray | None:
        if t not in computed:
            folded = ev.folded(t)
            if folded is not None:
                computed[t] = folded
            else:
                args = [value_of(a) for a in t.args]
                if any(a is None for a in args):
                    return None
                out = ev.numeric(t, args)  # type: ignore[arg-type]
                if out is None:
                    return None
                computed[t] = np.asarray(out)
        return computed[t]

    result = value_of(term)
    if result is None or not result.size:
        return
    was = ev.bounds_of(term)
    low, high = int(result.min()), int(result.max())
    if was is not None:
        low, high = max(low, int(was[0])), min(high, int(was[1]))
    if low <= high:
        ev._set_bounds(term, low, high)


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


def unclamped(ev: Builder, lo: np.ndarray, x: Term, hi: np.ndarray) -> Term | None:
    """x for clamp(lo, x, hi) when x's bounds lie inside [lo, hi] at every element (the clamp then
    leaves every element as it is), else None."""
    found = ev.bounds_of(x)
    if found is None or not lo.size or not hi.size:
        return None
    return x if float(lo.max()) <= found[0] and found[1] <= float(hi.min()) else None


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
