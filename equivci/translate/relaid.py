"""Values moved without arithmetic, found as windows of the values they were moved from.

An all-to-all that reshards a value from rows to columns (what SPMD partitioning inserts when a
gradient's sharding changes) is, on each device, reshape(transpose(concat(a window of every
device's rows))). With every element of the sources numbered, the labels of the result say where
each element came from: when the result, cut along one dim, is runs each of which is one box of one
source read in row-major order, it is the concatenation of those windows (reshaped). Exact: the
labels are compared element by element, so a run read in another order (a transposed box) or from
two sources is no window.

A source known to be one box of a bigger value (`known`: a group's piece of a value the reference
computes group by group, regroup.py) is labelled by that box of the bigger value's numbers, so the
windows found are of the bigger value: the slots every group's device sends to one expert's device
(an all-to-all after a per-group dispatch) are one window of the reference's slots of all groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from equivci.terms.ir import Term
from equivci.terms.spec import parse_transpose

MOVES = ("slice", "reshape", "transpose", "concat")
MAX_NODES = 32
MAX_RUNS = 64

Box = tuple[tuple[int, int], ...]


def windows(
    operand: Term, out_shape: tuple[int, ...], budget: int, known: Mapping[Term, tuple[Term, Box]] | None = None
) -> tuple[int, list[tuple[Term, Box, int]]] | None:
    """(dim, [(source, box, run length)]) when reshape(operand, out_shape) is the concatenation along
    dim of the sources' boxes (each reshaped to its run of the result), fewest runs first; None when the
    operand is not moved by a transpose or concatenation, or is no such concatenation. `known`: sources
    that are a box of a bigger value (read in row-major order), which is then the source."""
    known = known or {}
    sources: dict[Term, int] = {}
    nodes = _walk(operand, sources)
    if nodes is None or not any(t.op in ("transpose", "concat") for t in nodes):
        return None
    bases = list(dict.fromkeys(known[t][0] if t in known else t for t in sources))
    sizes = [int(np.prod(t.shape)) for t in bases]
    if not sizes or sum(sizes) > budget or 0 in out_shape:
        return None
    starts = np.cumsum([0] + sizes)
    numbers = {b: lo + np.arange(int(np.prod(b.shape))).reshape(b.shape) for b, lo in zip(bases, starts[:-1].tolist())}

    def leaf(t: Term) -> np.ndarray:
        if t not in known:
            return numbers[t]
        whole, box = known[t]
        return numbers[whole][tuple(slice(a, b) for a, b in box)].reshape(t.shape)

    labels = _labels(operand, leaf)
    out = labels.reshape(out_shape)
    source_of = np.searchsorted(starts, out, side="right") - 1
    order = bases
    best = None
    for dim in range(len(out_shape)):
        found = _runs(out, source_of, dim, order, starts)
        if found is not None and (best is None or len(found) < len(best[1])):
            best = (dim, found)
    return best


def _walk(t: Term, sources: dict[Term, int], seen: list[Term] | None = None) -> list[Term] | None:
    """The move nodes of the tree under t (sources recorded in order), None past MAX_NODES."""
    seen = [] if seen is None else seen
    if t.op not in MOVES:
        sources.setdefault(t, len(sources))
        return seen
    seen.append(t)
    if len(seen) > MAX_NODES:
        return None
    for a in t.args:
        if _walk(a, sources, seen) is None:
            return None
    return seen


def _labels(t: Term, leaf: Callable[[Term], np.ndarray]) -> np.ndarray:
    if t.op not in MOVES:
        return leaf(t)
    if t.op == "concat":
        return np.concatenate([_labels(a, leaf) for a in t.args], axis=t.attrs[0])
    inner = _labels(t.args[0], leaf)
    if t.op == "reshape":
        return inner.reshape(t.shape)
    if t.op == "transpose":
        return inner.transpose(parse_transpose(t.attrs[0]))
    dim, start, stop = t.attrs
    return np.take(inner, np.arange(start, stop), axis=dim)


def _runs(out: np.ndarray, source_of: np.ndarray, dim: int, order: list[Term], starts: np.ndarray):
    """[(source, box, length)] for the runs of `out` along dim, when every slab along dim comes from one
    source and every run of slabs from one source is one box of it in order; else None."""
    ids = np.moveaxis(source_of, dim, 0).reshape(out.shape[dim], -1)
    if not np.all(ids == ids[:, :1]):
        return None
    first = ids[:, 0]
    cuts = [0] + [i for i in range(1, len(first)) if first[i] != first[i - 1]] + [len(first)]
    if len(cuts) - 1 > MAX_RUNS:
        return None
    found = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        k = int(first[lo])
        source = order[k]
        local = np.take(out, np.arange(lo, hi), axis=dim).ravel() - starts[k]
        coords = np.unravel_index(local, source.shape)
        box = tuple((int(c.min()), int(c.max()) + 1) for c in coords)
        if int(np.prod([b - a for a, b in box])) != local.size:
            return None
        whole = np.arange(int(np.prod(source.shape))).reshape(source.shape)
        if not np.array_equal(whole[tuple(slice(a, b) for a, b in box)].ravel(), local):
            return None
        found.append((source, box, hi - lo))
    return found
