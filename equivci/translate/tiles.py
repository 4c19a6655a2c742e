"""Copies of a value laid side by side (a tile) found as the concatenation of those copies.

`jnp.tile(y, r)`, `jnp.broadcast_to(y[None], (r, *y.shape)).reshape(...)` and an einops-style
`repeat("... d -> ... (r d)")` are all reshape(bcast(y)) with the copy dim before the dim it is
merged into; a reference that writes the same tile as `concatenate([y] * r)` builds a concat. The
general fact: reshape(bcast(y)) with r = size / size(y) is concat([reshape(y)] * r, d) exactly when,
cut along d into r equal parts, every part reads y's elements in row-major order (a tile along
several dims: the same once more on the part). It is checked on
numbered elements, so a repeat (each element copied r times in a row, `jnp.repeat`: the copy dim
after the merged dim) is never taken for a tile: its parts read y's elements out of order, and it
stays the broadcast that rules/repeats.py relates.

A device's window of a repeat is a repeat of its window when the window is aligned with the copies
(it holds whole groups: two query heads of one KV head). Holding one group, its copies are also a
tile (one element copied r times either way), and a dot reading them is the copies of one dot
(reductions.dot_of_copies), which the reference's repeat holds at those heads (rules/repeats.py,
one row at a time). A window that cuts a group (query heads 2 and 3 of 6, with 3 per KV head) is
no repeat of a window: nothing here relates it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from equivci.terms import semantics
from equivci.terms.ir import Term
from equivci.terms.spec import BcastSpec

MAX_COPIES = 64  # a concatenation of more copies than this stays the broadcast it was written as


def tile_dims(operand: Term, out_shape: tuple[int, ...], budget: int) -> list[tuple[int, int]] | None:
    """[(d, r), ...] when reshape(operand, out_shape), operand = bcast(y), is y reshaped, then
    concatenated r times along d for each pair from the last to the first (a tile along several
    dims: `jnp.tile(y, (2, 3))`); None otherwise, or when the value has more than `budget` elements
    to label."""
    if operand.op != "bcast":
        return None
    (y,) = operand.args
    size, whole = int(np.prod(y.shape)), int(np.prod(out_shape))
    if size == 0 or whole > budget or whole % size or not 2 <= whole // size <= MAX_COPIES:
        return None
    labels = semantics.broadcast(np.arange(size).reshape(y.shape), operand.attrs[0], operand.shape)
    return _copies(labels.reshape(out_shape), size)


def _copies(labels: np.ndarray, size: int) -> list[tuple[int, int]] | None:
    """The splits that leave y's elements in row-major order (the most copies along a dim first)."""
    if labels.size == size:
        return [] if np.array_equal(labels, np.arange(size).reshape(labels.shape)) else None
    left = labels.size // size
    for d, n in enumerate(labels.shape):
        for r in sorted((r for r in range(2, left + 1) if n % r == 0 and left % r == 0), reverse=True):
            first, *others = np.split(labels, r, axis=d)
            if all(np.array_equal(first, other) for other in others):
                rest = _copies(first, size)
                if rest is not None:
                    return [(d, r), *rest]
    return None


@dataclasses.dataclass(frozen=True)
class CopiedWindow:
    """A window of reshape(bcast(y)) found to be reshape(bcast(y[box])) with one new dim's count
    changed: y's window `box`, broadcast by `dims` into `shape`."""

    box: tuple[tuple[int, int], ...]
    shape: tuple[int, ...]
    dims: tuple[int, ...]


def copied_window(
    operand: Term, out_shape: tuple[int, ...], ranges: list[tuple[int, int]], budget: int
) -> CopiedWindow | None:
    """The window `ranges` of reshape(operand, out_shape), operand = bcast(y), as the same copies of
    a window of y, when it is one: a window of copies is copies of a window exactly when the elements
    it holds are a box of y, each copied the same number of times in the same layout.

    For a repeat (y's index p // r at p along d, `jnp.repeat`) and a window [s, s + L) along d, that
    is when every group of copies the window meets is cut to the same count c: the window is then
    repeat(y[s // r : (s + L - 1) // r + 1], c). So with whole groups (s and L multiples of r: c = r),
    inside one group (s // r = (s + L - 1) // r: c = L, one element of y copied; L dividing r and s a
    multiple of L is such a window) and two groups cut alike (r = 4, [2, 6): c = 2). A window whose
    groups are cut unevenly ([1, 5) with r = 4: 3 copies then 1) is no repeat: None. Checked on numbered elements, trying each new dim as the one whose count changes; None past
    `budget` elements."""
    labels = _labels(operand, out_shape, budget)
    if labels is None:
        return None
    (y,) = operand.args
    size = int(np.prod(y.shape))
    window = labels[tuple(slice(a, b) for a, b in ranges)]
    held = np.unique(window)
    coords = np.unravel_index(held, y.shape)
    box = tuple((int(c.min()), int(c.max()) + 1) for c in coords)
    if int(np.prod([b - a for a, b in box])) != held.size:
        return None
    part = np.arange(size).reshape(y.shape)[tuple(slice(a, b) for a, b in box)]
    spec = BcastSpec.parse(operand.attrs[0])
    dims = tuple(o for k in range(len(y.shape)) for o, i in spec.operand_dims() if i == k)
    shape = [part.shape[v] if kind == "i" else v for kind, v in spec.parts]
    for o, (kind, n) in enumerate(spec.parts):
        if kind != "n":
            continue
        others = int(np.prod([s for p, s in enumerate(shape) if p != o and spec.parts[p][0] == "n"]))
        count, left = divmod(window.size, part.size * others)
        if left or count < 1:
            continue
        trial = tuple(count if p == o else s for p, s in enumerate(shape))
        laid = semantics.broadcast(part, BcastSpec.of(part.ndim, trial, dims).text(), trial)
        if np.array_equal(laid.reshape(window.shape), window):
            return CopiedWindow(box, trial, dims)
    return None


def constant_along(operand: Term, out_shape: tuple[int, ...], dim: int, budget: int) -> bool:
    """Whether reshape(operand, out_shape), operand = bcast(y), holds the same elements of y at every
    index along dim (copies of its first slice there), read on numbered elements."""
    labels = _labels(operand, out_shape, budget)
    return labels is not None and bool(
        np.array_equal(labels, np.broadcast_to(labels.take([0], axis=dim), labels.shape))
    )


def _labels(operand: Term, out_shape: tuple[int, ...], budget: int) -> np.ndarray | None:
    """reshape(bcast(y), out_shape) on y's elements numbered; None for no broadcast, or past `budget`."""
    if operand.op != "bcast":
        return None
    (y,) = operand.args
    size = int(np.prod(y.shape))
    if size == 0 or int(np.prod(out_shape)) > budget:
        return None
    return semantics.broadcast(np.arange(size).reshape(y.shape), operand.attrs[0], operand.shape).reshape(out_shape)
