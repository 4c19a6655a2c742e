"""A scatter of one element per row into a column given by data is a sum of one-hots.

    out = zeros[T, E].at[arange(T)[:, None], col].set(v)       col, v: [T, K]
    out[t, e] = sum_k [col[t, k] == e] * v[t, k]

holds for a scatter-add always, and for an overwriting scatter into zeros when no row writes one
column twice (the columns of a row are distinct: a top-k's or an argsort's indices, a slice of a
permutation of each lane). Every index coordinate but the column must be the row's own position
(an iota along one of the rows' dims, or a batching dim: a vmapped `zeros(E).at[col].set(v)`),
so that distinct rows never meet. A column outside [0, E) writes nothing (XLA skips it) and its
one-hot is all zeros. The sum is built as `jax.nn.one_hot` writes it, compare(broadcast(col),
broadcast(iota)) converted and multiplied, so that a top-k combine written with `.at[].set` meets
one written with `one_hot(...) * v` summed over k, or as an einsum of the one-hots with v
(reductions.product_sum states such a dot as that sum).
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import AlignedMap, ReduceSpec, bcast_spec, compare_text, transpose_text
from equivci.translate import bounds, one_hot_columns
from equivci.translate.attributes import dims_attr, scatter_combiner
from equivci.translate.builder import Builder


def columns(ev: Builder, inst: Instruction, args: list) -> Term | None:
    """The scatter as the sum of its rows' one-hots (module docstring), or None when it is not a
    scatter of single elements at (row positions, one data column) or a write could be lost."""
    if len(args) != 3 or inst.shape.is_tuple:
        return None
    combiner = scatter_combiner(ev.module, inst)
    if combiner is None:
        return None
    adds = combiner == "add"
    x, idx, update = args
    attrs = inst.attrs
    rank = len(x.shape)
    to_operand = dims_attr(attrs.get("scatter_dims_to_operand_dims"))
    batch, idx_batch = (
        dims_attr(attrs.get("input_batching_dims")),
        dims_attr(attrs.get("scatter_indices_batching_dims")),
    )
    vector_dim = int(attrs.get("index_vector_dim", len(idx.shape)))
    rows = tuple(idx.shape[j] for j in range(len(idx.shape)) if j != vector_dim)
    if (
        dims_attr(attrs.get("update_window_dims"))
        or len(batch) != len(idx_batch)
        or vector_dim in idx_batch
        or sorted((*dims_attr(attrs.get("inserted_window_dims")), *batch)) != list(range(rank))
        or sorted((*to_operand, *batch)) != list(range(rank))
        or (vector_dim < len(idx.shape) and idx.shape[vector_dim] != len(to_operand))
        or (vector_dim == len(idx.shape) and len(to_operand) != 1)
        or update.shape != rows
        or update.dtype != x.dtype
        or x.dtype == "pred"
    ):
        return None
    # rows dim -> the operand dim it writes at its own position: a batching dim (vmap's), or an
    # index coordinate that is an iota along that rows dim
    operand_of = {j - (j > vector_dim): d for d, j in zip(batch, idx_batch)}
    free = []
    for j, d in enumerate(to_operand):
        coord = coordinate(ev, idx, vector_dim, j, rows)
        b = position_dim(ev, coord)
        if b is None:
            free.append((coord, d))
        elif b in operand_of:
            return None
        else:
            operand_of[b] = d
    if not operand_of or len(free) != 1:
        return None  # (a scatter into a vector, bincount's, is a row scatter: permutations.py)
    if any(rows[b] != x.shape[d] for b, d in operand_of.items()):
        return None
    summed = [b for b in range(len(rows)) if b not in operand_of]
    column, k = free[0]
    zero = ev.uniform(x) == 0
    if not adds and not (zero and (not summed or (len(summed) == 1 and _distinct_along(ev, column, summed[0])))):
        return None  # an overwrite that may lose a write, or keep part of the operand
    added = _one_hot_sum(ev, column, update, x.shape[k], summed)
    kept = [b for b in range(len(rows)) if b not in summed]
    out_dims = [operand_of[b] for b in kept] + [k]
    if out_dims != list(range(rank)):
        perm = tuple(out_dims.index(d) for d in range(rank))
        added = ev.normal("transpose", (transpose_text(perm),), [added], Shape(x.dtype, x.shape))
    return added if zero else ev.binary("add", x, added)


def coordinate(ev: Builder, idx: Term, vector_dim: int, j: int, rows: tuple[int, ...]) -> Term:
    """Coordinate j of every index vector, shaped as the rows: taken inside a clamp of the index
    vectors to constants (vmap's `dynamic_update_slice` clamps its start), which is dropped where
    the coordinate's bounds lie inside it (bounds.unclamped)."""
    if vector_dim == len(idx.shape):
        return idx
    if idx.op == "ternary" and idx.attrs == ("clamp",) and all(t.shape == idx.shape for t in idx.args):
        lo, inner, hi = (coordinate(ev, t, vector_dim, j, rows) for t in idx.args)
        low, high = ev.folded(lo), ev.folded(hi)
        if low is not None and high is not None and (plain := bounds.unclamped(ev, low, inner, high)) is not None:
            return plain
        return ev.normal("ternary", ("clamp",), [lo, inner, hi], Shape(idx.dtype, rows))
    return ev.reshape_term(ev.slice_term(idx, vector_dim, j, j + 1), Shape(idx.dtype, rows))


def position_dim(ev: Builder, coord: Term) -> int | None:
    """The rows' dim b when the coordinate is every row's own position along b (a known iota)."""
    value = ev.folded(coord)
    if value is None or value.ndim == 0:
        return None
    for b in range(value.ndim):
        lane = np.arange(value.shape[b]).reshape([-1 if d == b else 1 for d in range(value.ndim)])
        if np.array_equal(value, np.broadcast_to(lane, value.shape)):
            return b
    return None


def _distinct_along(ev: Builder, t: Term, dim: int) -> bool:
    """Whether no two elements of a lane of `t` along `dim` are equal, by its form: a window of
    the index output of a stable sort along `dim` (a permutation of each lane of the indices
    sorted with it) whose lanes hold distinct values (the iota of a top-k or an argsort)."""
    while t.op == "slice":
        t = t.args[0]
    if t.op != "aligned":
        return False
    order_dim_output = AlignedMap.op_key(t.attrs[0]).split(":")
    if order_dim_output[0] != "sort" or order_dim_output[-2:] != [str(dim), "1"]:
        return False
    lanes = t.args[1]
    if lanes.op == "iota":
        return lanes.attrs[0] == dim
    value = ev.folded(lanes)
    if value is None:
        return False
    ordered = np.sort(np.moveaxis(value, dim, -1), axis=-1)
    return bool(np.all(ordered[..., 1:] != ordered[..., :-1]))


def _one_hot_sum(ev: Builder, column: Term, update: Term, width: int, summed: list[int]) -> Term:
    """sum over `summed` of convert(column[..., None] == iota(width)) * update[..., None]."""
    n = len(column.shape)
    shape = (*column.shape, width)
    columns = spread(ev, column, shape, tuple(range(n)))
    across = spread(ev, ev.const(np.arange(width, dtype=NP_DTYPES[column.dtype]), column.dtype), shape, (n,))
    equal = bounds.decide(ev, "EQ", columns, across, Shape("pred", shape)) or ev.mk(
        "binary", (compare_text("EQ", column.dtype),), [columns, across], Shape("pred", shape)
    )
    # known as a one-hot of the column: a device's test against its experts' ids is a window of it
    one_hot_columns.record(ev, equal, "EQ", columns, across)
    one_hot = ev.normal("unary", ("convert",), [equal], Shape(update.dtype, shape))
    product = ev.binary("multiply", one_hot, spread(ev, update, shape, tuple(range(n))))
    if not summed:
        return product
    out = Shape(update.dtype, tuple(s for d, s in enumerate(shape) if d not in summed))
    key = ReduceSpec(len(shape), tuple(summed)).text()
    return ev.normal("reduce", ("add", key), [product], out)


def spread(ev: Builder, t: Term, shape: tuple[int, ...], dims: tuple[int, ...]) -> Term:
    """broadcast(t) in the form the broadcast handler gives it (shapes.broadcast_term): a constant
    factor stays in front, a constant's value is kept for folding."""
    factor, base = ev.scale_of(t)
    if factor != 1 and (scaled := ev.scaled(spread(ev, base, shape, dims), factor)) is not None:
        return scaled
    term = ev.mk("bcast", (bcast_spec(len(t.shape), shape, dims),), [t], Shape(t.dtype, shape))
    value = ev.folded(t)
    if value is not None and np.prod(shape) <= ev.budgets.fold_elements:
        laid_out = value.reshape([value.shape[dims.index(o)] if o in dims else 1 for o in range(len(shape))])
        ev.values[term] = np.broadcast_to(laid_out, shape)
    return term
