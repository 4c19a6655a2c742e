"""Scatter-adds as terms: the gradients of a gather. A scatter-add of one element per row at the
row's own index (take_along_axis's gradient) is an aligned map of (update, indices) over the rows;
a scatter-add of whole windows at one index per row (an embedding table's gradient) is the update
contracted over the rows with the rows' one-hot of the indices. Either way a shard of the rows adds
its shard's part, which the rules relate; an index outside the dim adds nothing, as HLO skips it.
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import AlignedMap, DotSpec, transpose_text
from equivci.translate.attributes import dims_attr, reducer_of
from equivci.translate.builder import SCALABLE, Builder


def per_row(ev: Builder, inst: Instruction, args: list) -> Term | None:
    """A scatter-add of one element per row at that row's own index along one dim (the gradient
    of take_along_axis: every other operand dim a batching dim): the operand plus an aligned
    map of (updates, indices) over the rows, so that a shard of the rows adds the shard."""
    if len(args) != 3 or inst.shape.is_tuple or reducer_of(ev.module, inst) != "add":
        return None
    x, idx, update = args
    attrs = inst.attrs
    batch, idx_batch = (
        dims_attr(attrs.get("input_batching_dims")),
        dims_attr(attrs.get("scatter_indices_batching_dims")),
    )
    inserted, to_operand = (
        dims_attr(attrs.get("inserted_window_dims")),
        dims_attr(attrs.get("scatter_dims_to_operand_dims")),
    )
    vector_dim = int(attrs.get("index_vector_dim", len(idx.shape)))
    idx_dims = [j for j in range(len(idx.shape)) if j != vector_dim]
    if (
        dims_attr(attrs.get("update_window_dims"))
        or len(inserted) != 1
        or inserted != to_operand
        or sorted((*batch, *inserted)) != list(range(len(x.shape)))
        or (vector_dim < len(idx.shape) and idx.shape[vector_dim] != 1)
        or update.shape != tuple(idx.shape[j] for j in idx_dims)
        or any(idx.shape[j] != 1 for j in idx_dims if j not in idx_batch)
        or update.dtype != x.dtype
    ):
        return None
    # rows in the order of the indices' batching dims; the unit dims around them reshaped away
    rows = [j for j in idx_dims if j in idx_batch]
    out_of = {j: batch[idx_batch.index(j)] for j in rows}
    if [out_of[j] for j in rows] != sorted(out_of.values()):
        return None
    shape = tuple(idx.shape[j] for j in rows)
    update = ev.reshape_term(update, Shape(update.dtype, shape))
    idx = ev.reshape_term(idx, Shape(idx.dtype, shape))
    table = tuple((r, out_of[j]) for r, j in enumerate(rows))
    fixed = ((inserted[0], x.shape[inserted[0]]),)
    factor = ev.uniform(update)
    if factor is not None and update.dtype in SCALABLE:
        # the same number c on every row: c times a function of the indices alone (their
        # shard's rows), c a constant factor like any other
        base = ev.const(np.asarray(1, NP_DTYPES[update.dtype]), update.dtype)
        lhs: tuple[tuple[int, int], ...] = ()
    else:
        (factor, base), lhs = ev.scale_of(update), table
    key = AlignedMap(lhs, table, fixed).key("scatter-add")
    added = ev.scaled(ev.mk("aligned", (key,), (base, idx), inst.shape), factor)
    if added is None:
        return None
    return added if ev.uniform(x) == 0 else ev.binary("add", x, added)


def windows(ev: Builder, inst: Instruction, args: list) -> Term | None:
    """A scatter-add of whole windows at one index per row along one dim (an embedding table's
    gradient: each token's row added at its id) is the update contracted over the rows with the
    rows' one-hot of the indices, dot(update, onehot(idx)): a sum over rows like any other, so a
    device's rows add their part (index outside the dim: nothing added, as HLO skips it)."""
    if len(args) != 3 or inst.shape.is_tuple or reducer_of(ev.module, inst) != "add":
        return None
    x, idx, update = args
    attrs = inst.attrs
    window = dims_attr(attrs.get("update_window_dims"))
    inserted, to_operand = (
        dims_attr(attrs.get("inserted_window_dims")),
        dims_attr(attrs.get("scatter_dims_to_operand_dims")),
    )
    vector_dim = int(attrs.get("index_vector_dim", len(idx.shape)))
    if attrs.get("input_batching_dims") or len(to_operand) != 1 or inserted not in ((), to_operand):
        return None
    k = to_operand[0]
    rows = [u for u in range(len(update.shape)) if u not in window]
    kept = [d for d in range(len(x.shape)) if d not in inserted]  # the operand dims the window spans
    sizes = dict(zip(kept, (update.shape[u] for u in window)))
    if (
        (vector_dim < len(idx.shape) and idx.shape[vector_dim] != 1)
        or len(kept) != len(window)
        or sizes.get(k, 1) != 1
        or any(sizes[d] != x.shape[d] for d in kept if d != k)
        or [update.shape[u] for u in rows] != [idx.shape[j] for j in range(len(idx.shape)) if j != vector_dim]
        or update.dtype != x.dtype
        or update.dtype not in SCALABLE
    ):
        return None
    # the update without its unit window dim at k: [window dims except k..., rows...] in its own order
    free = [u for u, d in zip(window, kept) if d != k]
    update = ev.reshape_term(update, Shape(update.dtype, tuple(update.shape[u] for u in sorted(free + rows))))
    position = {u: n for n, u in enumerate(sorted(free + rows))}
    row_shape = tuple(update.shape[position[u]] for u in rows)
    idx = ev.reshape_term(idx, Shape(idx.dtype, row_shape))
    one = ev.const(np.asarray(1, NP_DTYPES[update.dtype]), update.dtype)
    table = tuple((r, r) for r in range(len(rows)))
    key = AlignedMap((), table, ((len(rows), x.shape[k]),)).key("scatter-add")
    onehot = ev.mk("aligned", (key,), (one, idx), Shape(update.dtype, (*row_shape, x.shape[k])))
    contract = tuple(position[u] for u in rows)
    spec = DotSpec((), (), contract, tuple(range(len(rows))), len(update.shape), len(onehot.shape), (update.dtype,) * 2)
    # dot output: the free window dims in operand order, then the indexed dim
    out_dims = [d for d in range(len(x.shape)) if d != k] + [k]
    dot_shape = Shape(x.dtype, tuple(x.shape[d] for d in out_dims))
    added = ev.normal("dot", (spec.text(),), [update, onehot], dot_shape)
    if out_dims != list(range(len(x.shape))):
        perm = tuple(out_dims.index(d) for d in range(len(x.shape)))
        added = ev.normal("transpose", (transpose_text(perm),), [added], Shape(x.dtype, x.shape))
    return added if ev.uniform(x) == 0 else ev.binary("add", x, added)
