"""Dynamic slices at a start offset from a value of known range (chunked prefill: each device
slices the table rows of its own positions at `start + axis_index * rows`).

HLO clamps a dynamic slice's start into [0, n - size]. Where `base + c` stays inside that range for
every value `base` can take (its bounds [lo, hi]), no clamping happens, and

    dslice(x, base + c, size) = slice(dslice(x, base - lo, n - (hi - lo)), lo + c, lo + c + size)

(element i of both is x[base + c + i]; the wider dynamic slice never clamps either). So slices at
`start`, `start + 8`, `start + 16` of one table become windows of one term, which the window rules
relate like any other. The bounds come from what the reference takes for granted: an integer input
it uses as a slice start is a valid start (bounds.index_domains).
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import GatherDims
from equivci.translate import masks
from equivci.translate.bounds import offset_input, unwrapped_index
from equivci.translate.builder import Builder


def note_starts(ev: Builder, inst: Instruction, x: Term, starts: list, sizes: tuple[int, ...]) -> None:
    """Record each start of a dynamic slice (or update) of `x` by `sizes` elements as an index use:
    valid starts are [0, n - size] (JAX wraps a negative one by n first, as numpy indexing does).
    A window as long as its dim says nothing of its start (HLO clamps any start to 0 there)."""
    for dim, start in enumerate(starts):
        if isinstance(start, Term) and ev.folded(start) is None and sizes[dim] < x.shape[dim]:
            plain = unwrapped_index(ev, start, x.shape[dim])
            ev.index_uses.append((plain, x.shape[dim] - sizes[dim] + 1, (inst, *reversed(ev.calls))))


def offset_parts(ev: Builder, start: Term) -> tuple[Term, int]:
    """`start` as base + c with c an integer constant (nested adds and subtracts of constants
    summed), exactly: (start, 0) when there is no such constant."""
    c = 0
    while start.op == "binary" and start.attrs in (("add",), ("subtract",)) and start.shape == ():
        a, b = start.args
        k = masks.scalar_int(ev, b)
        if k is None and start.attrs == ("add",):
            a, b, k = b, a, masks.scalar_int(ev, a)
        if k is None or a.dtype != start.dtype:
            break
        c += k if start.attrs == ("add",) else -k
        start = a
    return start, c


def window(ev: Builder, x: Term, dim: int, start: Term, size: int) -> Term | None:
    """`size` elements of `x` along `dim` from `start` as a window of the dynamic slice at the
    start's base, when no value of the base makes HLO clamp; None otherwise."""
    base, c = offset_parts(ev, start)
    bounds = ev.bounds_of(base)
    if bounds is None or not np.all(np.isfinite(bounds)):
        return None
    lo, hi, n = int(bounds[0]), int(bounds[1]), x.shape[dim]
    if not (0 <= lo + c and hi + c <= n - size):  # some value of the base would clamp
        return None
    width = n - (hi - lo)
    if lo != 0:
        shift = ev.const(np.asarray(lo, dtype=NP_DTYPES[base.dtype]), base.dtype)
        base = ev.binary("subtract", base, shift)
    shape = list(x.shape)
    shape[dim] = width
    whole = x if width == n else ev.mk("dslice", (dim, width), (x, base), Shape(x.dtype, tuple(shape)))
    return ev.slice_term(whole, dim, lo + c, lo + c + size)


def consecutive_rows(ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """x[p + c0 + arange(n)] along dim 0 (a gather of whole rows at consecutive positions from a
    scalar p, `jnp.take(table, start + jnp.arange(n), axis=0)`) is the window of n rows from
    p + c0, where no value of p puts a row out of bounds (a gather clamps each row on its own, a
    dynamic slice the whole window: they agree only there); None otherwise."""
    rank = len(x.shape)
    if len(idx.shape) == 2 and idx.shape[1] == 1 and dims.vector_dim == 1:  # one index per row
        idx = ev.reshape_term(idx, Shape(idx.dtype, idx.shape[:1]))
    if (
        len(idx.shape) != 1
        or dims.start_map != (0,)
        or dims.collapsed != (0,)
        or dims.operand_batch
        or tuple(dims.offset) != tuple(range(1, rank))
        or tuple(dims.slice_sizes) != (1, *x.shape[1:])
        or out.dims != (idx.shape[0], *x.shape[1:])
    ):
        return None
    base, c = offset_input(ev, idx)
    if base is idx or c.shape != idx.shape or not np.array_equal(c, c[0] + np.arange(c.size)):
        return None
    start = (
        base
        if c[0] == 0
        else ev.binary("add", base, ev.const(np.asarray(c[0], dtype=NP_DTYPES[base.dtype]), base.dtype))
    )
    return window(ev, x, 0, start, c.size)
