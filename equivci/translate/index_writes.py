"""A scatter that overwrites one window at one index known only as a term, as a dynamic update.

`x.at[i].set(u)` (a KV cache written at the decode position) lowers to an HLO scatter with one
index vector of one element and an update window that covers every other dim of x. HLO scatter
skips an update whose window leaves x; dynamic-update-slice clamps its start into [0, n - w]
instead. For every i in [0, n - w] neither happens, and both write u at i:

    scatter(x, [i], u) = dupdate(x, reshape(u), i)    for 0 <= i <= n - w

(w: the window's size along the indexed dim, 1 when that dim is inserted). The fact holds only
there, so it is used only where the index's bounds (bounds.py) lie inside that range; the index is
recorded as an index use, so an input written at is taken to be a valid index like one read at
(bounds.index_domains, with the `note` finding that says so; `assume_valid_indices: false` refuses
the proof).
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.translate.attributes import called, dims_attr, overwrites
from equivci.translate.bounds import unwrapped_index
from equivci.translate.builder import Builder


def one_window(ev: Builder, inst: Instruction, args: list) -> Term | None:
    """The scatter as a dupdate (module docstring), or None when it is not an overwrite of one
    window at one index or the index may lie outside the window's valid starts."""
    if len(args) != 3 or inst.shape.is_tuple or not overwrites(called(ev.module, inst, "to_apply")):
        return None
    x, idx, update = args
    attrs = inst.attrs
    to_operand = dims_attr(attrs.get("scatter_dims_to_operand_dims"))
    window_dims = dims_attr(attrs.get("update_window_dims"))
    inserted = dims_attr(attrs.get("inserted_window_dims"))
    if attrs.get("input_batching_dims") or len(to_operand) != 1 or int(np.prod(idx.shape)) != 1:
        return None
    if ev.folded(idx) is not None or update.dtype != x.dtype:
        return None  # (constant indices: shapes.scatter_at_constants)
    dim = to_operand[0]
    operand_window = [d for d in range(len(x.shape)) if d not in inserted]
    if len(operand_window) != len(window_dims) or set(inserted) - {dim}:
        return None
    sizes = [1] * len(x.shape)
    for d, u in zip(operand_window, window_dims):
        sizes[d] = update.shape[u]
    if any(sizes[d] != x.shape[d] for d in range(len(x.shape)) if d != dim):
        return None  # a window narrower than x along another dim sits at offset 0 there: not this fact
    start = ev.reshape_term(idx, Shape(idx.dtype, ()))
    width = sizes[dim]
    ev.index_uses.append(
        (unwrapped_index(ev, start, x.shape[dim]), x.shape[dim] - width + 1, (inst, *reversed(ev.calls)))
    )
    bounds = ev.bounds_of(start)
    if bounds is None or bounds[0] < 0 or bounds[1] > x.shape[dim] - width:
        return None
    written = ev.reshape_term(update, Shape(x.dtype, tuple(sizes)))
    if written.shape == x.shape:
        return written
    return ev.mk("dupdate", (dim,), (x, written, start), Shape(x.dtype, x.shape))
