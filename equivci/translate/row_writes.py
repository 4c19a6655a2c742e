"""An overwriting scatter of one window per row, at a position given by data, as a select.

`cache.at[arange(B), slot].set(k)` (a ring buffer's KV cache written at each example's slot) and a
vmapped `dynamic_update_slice(cache, k[None], (slot, 0, 0))` lower to scatters whose index vectors
hold, besides the one data coordinate c along an operand dim k, only each row's own position (an
iota along the rows, or a batching dim), and whose update window spans every other operand dim
whole (a start of 0 there) and one element along k:

    out[..., w, ...] = update[...] if c[row] == w else x[..., w, ...]

Rows are distinct operand positions, so no two updates meet, and a c outside [0, n_k) writes
nothing (XLA skips a window that leaves the operand), as no w equals it: the select holds for
every value of c, no bounds needed. A device's rows of the scatter are then the select on its rows
of c, the update and x, a window of the reference's select, whatever local row numbers its iota
gave them. A clamp of the index (vmap's `dynamic_update_slice` clamps its start) is dropped where
the coordinate's bounds already lie inside it (bounds.unclamped).
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import compare_text
from equivci.translate import bounds
from equivci.translate.attributes import dims_attr, scatter_combiner
from equivci.translate.builder import Builder
from equivci.translate.one_hots import coordinate, position_dim, spread


def selected(ev: Builder, inst: Instruction, args: list) -> Term | None:
    """The scatter as a select (module docstring), or None when it is not an overwrite of one
    window per row at (the rows' own positions, one data coordinate)."""
    if len(args) != 3 or inst.shape.is_tuple or scatter_combiner(ev.module, inst) != "set":
        return None
    x, idx, update = args
    attrs = inst.attrs
    rank = len(x.shape)
    window_dims = dims_attr(attrs.get("update_window_dims"))
    inserted = dims_attr(attrs.get("inserted_window_dims"))
    to_operand = dims_attr(attrs.get("scatter_dims_to_operand_dims"))
    batch = dims_attr(attrs.get("input_batching_dims"))
    idx_batch = dims_attr(attrs.get("scatter_indices_batching_dims"))
    vector_dim = int(attrs.get("index_vector_dim", len(idx.shape)))
    row_dims = [j for j in range(len(idx.shape)) if j != vector_dim]
    rows = tuple(idx.shape[j] for j in row_dims)
    spanned = [d for d in range(rank) if d not in inserted and d not in batch]  # the window's operand dims
    if (
        update.dtype != x.dtype
        or len(batch) != len(idx_batch)
        or len(spanned) != len(window_dims)
        or (vector_dim < len(idx.shape) and idx.shape[vector_dim] != len(to_operand))
        or (vector_dim == len(idx.shape) and len(to_operand) != 1)
    ):
        return None
    size = dict(zip(spanned, (update.shape[u] for u in window_dims)))
    operand_of = {row_dims.index(j): d for d, j in zip(batch, idx_batch)}  # rows dim -> operand dim
    column: tuple[Term, int] | None = None
    for j, d in enumerate(to_operand):
        coord = coordinate(ev, idx, vector_dim, j, rows)
        b = position_dim(ev, coord)
        if b is not None and b not in operand_of and size.get(d, 1) == 1:
            operand_of[b] = d
        elif ev.uniform(coord) == 0 and size.get(d) == x.shape[d]:
            continue  # a whole dim from 0
        elif column is None and size.get(d, 1) == 1:
            column = (coord, d)
        else:
            return None
    if column is None or sorted(operand_of) != list(range(len(rows))):
        return None
    c, k = column
    written = set(operand_of.values()) | {k}
    if (
        len(written) != len(rows) + 1
        or any(rows[b] != x.shape[d] for b, d in operand_of.items())
        or any(size[d] != x.shape[d] for d in spanned if d not in written)
    ):
        return None
    # the update without its unit window dims along written dims, each dim's operand dim
    update_rows = [u for u in range(len(update.shape)) if u not in window_dims]
    at = dict(zip(update_rows, (operand_of[b] for b in range(len(rows)))))
    at.update({u: d for u, d in zip(window_dims, spanned) if d not in written})
    kept = sorted(at)
    dims = tuple(at[u] for u in kept)
    if list(dims) != sorted(dims) or [operand_of[b] for b in range(len(rows))] != sorted(operand_of.values()):
        return None  # (a transposed layout: not this form)
    value = ev.reshape_term(update, Shape(update.dtype, tuple(update.shape[u] for u in kept)))
    mask_dims = sorted(written)
    mask_shape = tuple(x.shape[d] for d in mask_dims)
    lanes = spread(ev, c, mask_shape, tuple(mask_dims.index(operand_of[b]) for b in range(len(rows))))
    iota = ev.const(np.arange(x.shape[k], dtype=NP_DTYPES[c.dtype]), c.dtype)
    across = spread(ev, iota, mask_shape, (mask_dims.index(k),))
    mask_pred = Shape("pred", mask_shape)
    hit = bounds.decide(ev, "EQ", lanes, across, mask_pred) or ev.mk(
        "binary", (compare_text("EQ", c.dtype),), [lanes, across], mask_pred
    )
    out = Shape(x.dtype, x.shape)
    return ev.normal(
        "ternary",
        ("select",),
        [spread(ev, hit, x.shape, tuple(mask_dims)), spread(ev, value, x.shape, dims), x],
        out,
    )
