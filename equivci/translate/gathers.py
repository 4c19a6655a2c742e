"""Gathers in other forms: through an elementwise op with a broadcast operand, and at an index
reshaped only by size-1 dims.

A gather picks elements and an elementwise op acts on each element alone, so
gather(f(x, y), i) = f(gather(x, i), gather(y, i)). When y is a broadcast of m that is constant
along every operand dim the gather picks along (the indexed dims and the window dims it does not
take whole), gather(y, i) is m broadcast onto the output at the dims the gather batches m's dims
to: gather(x - bcast(lse), i) = gather(x, i) - lse. A reference that takes log_softmax's
x - lse at the labels then meets a vocabulary-parallel device that looks up x at its labels first
and subtracts lse after the sum over shards.

This is the gather's normal form (Builder.gather_term), in both programs alike, and only where an
operand is such a broadcast: pushing a gather through every op would add a term per op for every
gather.

A gather's output rows along its index dims follow the index's elements in row-major order, so a
reshape of the index moves onto the output: gather(x, reshape(y)) is reshape(gather(x, y)) where
the window dims come last. A paged cache read of one page column per device,
`pages[table[:, d:d + 1][:, 0]]`, is then the gather at a window of the block table, which the
window rules (`aligned/rhs_lift`) relate to that window of the reference's `pages[table]`; a
flattened lookup `emb[ids.reshape(-1)]` is the reshape of `emb[ids]`. It is stated beside the
written gather (`reshaped_index`), where the normal form drops the index's size-1 dims so that
gathers of one index meet whatever its layout.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term, gather_map
from equivci.terms.spec import BcastSpec, GatherDims


class Evaluator(Protocol):
    """What pushing a gather needs of the evaluator (an equivci.translate.builder.Builder)."""

    def mk(self, op: str, attrs: tuple, args: tuple, shape: Shape) -> Term: ...

    def normal(self, kind: str, attrs: tuple, args, shape: Shape) -> Term: ...

    def gather_term(self, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None: ...

    def reshape_term(self, operand: Term, shape: Shape) -> Term: ...


def through_broadcast(ev: Evaluator, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """gather(x, idx) as f(gather(a, idx), m on the output) when x = f(a, bcast(m)) (or
    f(bcast(m), a)) with the broadcast kept by the gather; None otherwise."""
    if x.op != "binary":
        return None
    for k in (0, 1):
        spread = x.args[k]
        on_out = _gathered_bcast(ev, spread, len(idx.shape), dims, out) if spread.op == "bcast" else None
        other = ev.gather_term(x.args[1 - k], idx, dims, Shape(x.args[1 - k].dtype, out.dims)) if on_out else None
        if on_out is not None and other is not None:
            args = [other, on_out] if k == 1 else [on_out, other]
            return ev.normal("binary", x.attrs, args, Shape(x.dtype, out.dims))
    return None


def _gathered_bcast(ev: Evaluator, spread: Term, idx_rank: int, dims: GatherDims, out: Shape) -> Term | None:
    """The gather of bcast(m) as a broadcast of m onto the output, when every operand dim m varies
    along is a batching dim of the gather (its output dim holds the same index) or a window dim
    taken whole from 0 (not indexed); None otherwise."""
    rank = len(spread.shape)
    aligned = gather_map(dims, rank, idx_rank, len(out.dims))
    if aligned is None:
        return None
    window = [k for k in range(rank) if k not in dims.collapsed and k not in dims.operand_batch]
    out_of = dict(aligned.lhs)
    out_of.update(
        (k, o)
        for k, o in zip(window, sorted(dims.offset))
        if k not in dims.start_map and dims.slice_sizes[k] == spread.shape[k]
    )
    parts: list[tuple[str, int]] = [("n", size) for size in out.dims]
    for k, (kind, value) in enumerate(BcastSpec.parse(spread.attrs[0]).parts):
        if kind == "n":
            continue
        if k not in out_of:  # m varies along a dim the gather indexes or cuts
            return None
        parts[out_of[k]] = ("i", value)
    kept = [value for kind, value in parts if kind == "i"]
    if kept != sorted(kept):  # a broadcast keeps its operand's dims in order
        return None
    (m,) = spread.args
    if m.shape == tuple(out.dims) and kept == list(range(len(m.shape))):  # m itself, at the output's dims
        return m
    return ev.mk("bcast", (BcastSpec(tuple(parts)).text(),), spread.args, Shape(spread.dtype, out.dims))


def reshaped_index(ev: Evaluator, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """gather(x, reshape(y)) as reshape(gather(x, y)) where the gather reads one start per index
    element (an implicit index vector, no batching dims) and its window dims come last; None
    otherwise."""
    if idx.op != "reshape" or dims.operand_batch or dims.vector_dim != len(idx.shape):
        return None
    (y,) = idx.args
    rank, kept = len(y.shape), len(idx.shape)
    if tuple(dims.offset) != tuple(range(kept, len(out.dims))):
        return None
    wide = dataclasses.replace(dims, offset=tuple(range(rank, rank + len(dims.offset))), vector_dim=rank)
    term = ev.gather_term(x, y, wide, Shape(out.dtype, (*y.shape, *out.dims[kept:])))
    return None if term is None else ev.reshape_term(term, out)
