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

import numpy as np

from equivci.terms import semantics
from equivci.terms.ir import Term

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
