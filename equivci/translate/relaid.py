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
So is a source whose elements are a known piece's elements permuted, by two general facts: the
operand of a transposed piece (x = transpose(transpose(x, p), p^-1)), and a dot of the piece's
operands swapped (dot_general(a, b) = transpose(dot_general(b, a)) with the free dims exchanged:
the same products, summed alike), so a device that writes `einsum("sec,sd->ecd")` meets a
reference whose einsum put the tokens first.

The sources are where the moves end; when no window of those is found, the concatenations' parts
are taken as the sources instead, each read in any dim order: an all-to-all's received blocks
(each a window of a member's value, which may itself be a slice or a transpose of what the member
computed: the heads of a transposed attention output) joined and laid out by the reshape,
transpose, reshape around HLO's one-dim all-to-all are then the concatenation of those blocks
along the dim the all-to-all concatenates (Ulysses' heads back to the sequence shards). Exact
either way: the labels say where every element came from.

An all-to-all is a transpose of the (device, chunk) block grid: the run a device receives from each
group's piece may be a box of the bigger value read with its dims in another order (the reference
transposes its [groups, experts, ...] value to [experts, groups, ...] where the device reshapes
what it received). A run is then a box of transpose(value, perm), the perm found on the labels
(identity first); nothing else is a window.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from equivci.terms.ir import Term
from equivci.terms.spec import DotSpec, parse_transpose, swapped_dot

MOVES = ("slice", "reshape", "transpose", "concat")
MAX_NODES = 32
MAX_RUNS = 64
MAX_PERMUTED_RANK = 6  # 720 dim orders tried per run at most

Box = tuple[tuple[int, int], ...]
Perm = tuple[int, ...]
# a run of the result: (source, perm, box of transpose(source, perm), run length)
Run = tuple[Term, Perm, Box, int]


class _Walk(NamedTuple):
    """What the walk of one operand found: its sources (and the group pieces among them), the values
    they are read from, and a collective's parts; read by `_layout` and `_windows` alike."""

    operand: Term
    out_shape: tuple[int, ...]
    budget: int
    known: Mapping[Term, tuple[Term, Box]]
    pieces: dict[Term, tuple[Term, Perm]]
    bases: list[Term]
    sources: Mapping[Term, int]
    parts: set[Term]


def windows(
    operand: Term,
    out_shape: tuple[int, ...],
    budget: int,
    known: Mapping[Term, tuple[Term, Box]] | None = None,
    memo: dict | None = None,
) -> tuple[int, list[Run]] | None:
    """(dim, [(source, perm, box, run length)]) when reshape(operand, out_shape) is the concatenation
    along dim of boxes of the sources transposed by perm (each reshaped to its run of the result),
    fewest runs first; None when the operand is not moved by a transpose or concatenation, or is no
    such concatenation. `known`: sources that are a box of a bigger value (read in row-major order),
    which is then the source; and sources whose elements are such a box's permuted (module docstring).
    `memo`: answers by layout (`_layout`), shared by the calls of one translation."""
    known = known or {}
    found = _windows_at(operand, out_shape, budget, known, memo, False)
    return found or _windows_at(operand, out_shape, budget, known, memo, True)


def _windows_at(
    operand: Term,
    out_shape: tuple[int, ...],
    budget: int,
    known: Mapping[Term, tuple[Term, Box]],
    memo: dict | None,
    at_parts: bool,
) -> tuple[int, list[Run]] | None:
    """windows() with the sources where the moves end, or (`at_parts`) at the concatenations' parts
    (module docstring); None also when no part is a move (the same sources as without)."""
    sources: dict[Term, int] = {}
    parts: set[Term] = set()
    nodes = _walk(operand, sources, parts if at_parts else None)
    if nodes is None or not any(t.op in ("transpose", "concat") for t in nodes) or at_parts and not parts:
        return None
    permuted = _permuted_pieces(known)
    pieces = {t: piece for t in sources if (piece := _piece_of(t, known, permuted)) is not None}
    bases = list(dict.fromkeys(known[pieces[t][0]][0] if t in pieces else t for t in sources))
    # The answer depends on the terms only through the layout: the same moves of sources of the
    # same shapes (every layer's attention heads, every device's shard) are labelled alike.
    walk = _Walk(operand, out_shape, budget, known, pieces, bases, sources, parts)
    if memo is None:
        return _windows(walk)
    key = _layout(walk)
    if key not in memo:
        found = _windows(walk)
        index = {b: k for k, b in enumerate(bases)}
        memo[key] = None if found is None else (found[0], [(index[s], p, b, n) for s, p, b, n in found[1]])
    answer = memo[key]
    return None if answer is None else (answer[0], [(bases[k], p, b, n) for k, p, b, n in answer[1]])


def _layout(walk: _Walk) -> tuple:
    """Everything `_windows` reads of its arguments, with the sources named by their position among
    `bases`: the moves (op, attributes, shape) down to the sources, each source's shape and, for a
    piece, the box of its base it is and the order its elements are read in, and which bases are
    reorderable."""
    operand, out_shape, budget, known, pieces, bases, sources, parts = walk
    index = {b: k for k, b in enumerate(bases)}
    reorderable = {whole for whole, _ in known.values()} | parts

    def tree(t: Term) -> tuple:
        if t.op in MOVES and t not in sources:
            return (t.op, t.attrs, t.shape, *(tree(a) for a in t.args))
        if t not in pieces:
            return ("source", index[t])
        piece, perm = pieces[t]
        whole, box = known[piece]
        return ("piece", index[whole], box, piece.shape, perm)

    bases_layout = tuple((b.shape, b in reorderable) for b in bases)
    return (tree(operand), bases_layout, tuple(out_shape), budget)


def _windows(walk: _Walk) -> tuple[int, list[Run]] | None:
    operand, out_shape, budget, known, pieces, bases, sources, parts = walk
    sizes = [int(np.prod(t.shape)) for t in bases]
    if not sizes or sum(sizes) > budget or 0 in out_shape:
        return None
    starts = np.cumsum([0] + sizes)
    numbers = {b: lo + np.arange(int(np.prod(b.shape))).reshape(b.shape) for b, lo in zip(bases, starts[:-1].tolist())}

    def leaf(t: Term) -> np.ndarray:
        if t not in pieces:
            return numbers[t]
        piece, perm = pieces[t]
        whole, box = known[piece]
        return numbers[whole][tuple(slice(a, b) for a, b in box)].reshape(piece.shape).transpose(perm)

    labels = _labels(operand, leaf, sources)
    out = labels.reshape(out_shape)
    source_of = np.searchsorted(starts, out, side="right") - 1
    order = bases
    # only the values group pieces are boxes of, and a collective's parts, are read in another dim
    # order (through a piece or whole): elsewhere a reshape of a transposed value keeps the form
    # both programs write
    reorderable = {whole for whole, _ in known.values()} | parts
    best = None
    for dim in range(len(out_shape)):
        found = _runs(out, source_of, dim, order, starts, reorderable)
        if found is not None and (best is None or len(found) < len(best[1])):
            best = (dim, found)
    return best


def _permuted_pieces(known: Mapping[Term, tuple[Term, Box]]) -> dict:
    """Terms whose elements are a known piece's permuted, as the lookups _piece_of reads: the operand
    of a transposed piece by identity, a dot of swapped operands by (spec, lhs, rhs, dtype); each
    -> (piece, perm) with labels(term) = labels(piece).transpose(perm)."""
    found: dict = {}
    for piece in known:
        forms: list[tuple[Term, Perm]] = [(piece, tuple(range(len(piece.shape))))]
        if piece.op == "transpose":  # piece = transpose(x, p): x = transpose(piece, p^-1)
            forms.append((piece.args[0], tuple(int(k) for k in np.argsort(parse_transpose(piece.attrs[0])))))
        for term, perm in forms:
            if term is not piece:
                found.setdefault(term, (piece, perm))
            if term.op == "dot":  # term = transpose(swapped, back): swapped = transpose(term, back^-1)
                spec, back = swapped_dot(DotSpec.parse(term.attrs[0]), tuple(range(len(term.shape))))
                key = (spec.text(), term.args[1], term.args[0], term.dtype)
                found.setdefault(key, (piece, tuple(perm[int(k)] for k in np.argsort(back))))
    return found


def _piece_of(t: Term, known: Mapping[Term, tuple[Term, Box]], permuted: dict) -> tuple[Term, Perm] | None:
    if t in known:
        return t, tuple(range(len(t.shape)))
    if t.op == "dot" and (found := permuted.get((t.attrs[0], t.args[0], t.args[1], t.dtype))) is not None:
        return found
    return permuted.get(t)


def _walk(
    t: Term, sources: dict[Term, int], parts: set[Term] | None, seen: list[Term] | None = None, part: bool = False
) -> list[Term] | None:
    """The move nodes of the tree under t (sources recorded in order), None past MAX_NODES. With
    `parts`, a concatenation's part is a source too (recorded in `parts` when it is a move)."""
    seen = [] if seen is None else seen
    if t.op not in MOVES or parts is not None and part and t.op != "concat":
        if t.op in MOVES and parts is not None:
            parts.add(t)
        sources.setdefault(t, len(sources))
        return seen
    seen.append(t)
    if len(seen) > MAX_NODES:
        return None
    for a in t.args:
        if _walk(a, sources, parts, seen, t.op == "concat") is None:
            return None
    return seen


def _labels(t: Term, leaf: Callable[[Term], np.ndarray], sources: Mapping[Term, int]) -> np.ndarray:
    if t in sources:
        return leaf(t)
    if t.op == "concat":
        return np.concatenate([_labels(a, leaf, sources) for a in t.args], axis=t.attrs[0])
    inner = _labels(t.args[0], leaf, sources)
    if t.op == "reshape":
        return inner.reshape(t.shape)
    if t.op == "transpose":
        return inner.transpose(parse_transpose(t.attrs[0]))
    dim, start, stop = t.attrs
    return np.take(inner, np.arange(start, stop), axis=dim)


def _runs(
    out: np.ndarray, source_of: np.ndarray, dim: int, order: list[Term], starts: np.ndarray, reorderable: set[Term]
) -> list[Run] | None:
    """[(source, perm, box, length)] for the runs of `out` along dim, when every slab along dim comes
    from one source and every run of slabs from one source is one box of the source (transposed by
    perm, for a `reorderable` source), read in order; else None."""
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
        run = tuple(hi - lo if k == dim else n for k, n in enumerate(out.shape))
        block = whole[tuple(slice(a, b) for a, b in box)]
        in_order = np.array_equal(block.ravel(), local)
        perm = _reading_order(block, local, run) if source in reorderable else None
        if perm is None and in_order:
            perm = tuple(range(block.ndim))
        if perm is None:
            return None
        found.append((source, perm, tuple(box[k] for k in perm), hi - lo))
    return found


def _reading_order(block: np.ndarray, local: np.ndarray, run: tuple[int, ...]) -> Perm | None:
    """The perm with block.transpose(perm) read in row-major order equal to local: one that gives the
    block the run's own shape first (the reference's transpose of the value, sliced, is then the very
    term), else one that keeps the unit dims in place (moving them reads the same order), identity
    first."""
    if block.ndim == len(run) and block.ndim <= MAX_PERMUTED_RANK:
        for perm in itertools.permutations(range(block.ndim)):
            if tuple(block.shape[k] for k in perm) == run and np.array_equal(block.transpose(perm).ravel(), local):
                return tuple(perm)
    moving = [k for k in range(block.ndim) if block.shape[k] > 1]
    if len(moving) > MAX_PERMUTED_RANK:
        return None
    for order in itertools.permutations(moving):
        placed = list(range(block.ndim))
        for k, m in zip(moving, order):
            placed[k] = m
        if np.array_equal(block.transpose(placed).ravel(), local):
            return tuple(placed)
    return None
