"""Handlers of the layout ops (broadcast, reshape, transpose, slices, concatenation, gather, and
writes of windows: dynamic-update-slice, a scatter at constant indices) and of the plumbing ops
(copy, tuple, get-tuple-element, the sharding custom-calls), which are their operand.

A window is a `slice` of the whole it is cut from, written so that windows taken in different ways
(a strided slice, a microbatch of a reshape, a device's rows) meet as the same term.
"""

from __future__ import annotations

import re
from typing import cast

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.spec import GatherDims, bcast_spec, parse_transpose, reshape_spec, transpose_text
from equivci.translate import (
    argmax_pieces,
    gathers,
    index_writes,
    masks,
    offsets,
    one_hots,
    picks,
    pieces,
    row_writes,
    scatter_adds,
    tiles,
)
from equivci.translate.attributes import (
    called,
    custom_call_target,
    dims_attr,
    overwrites,
    reducer_of,
    semantic_attrs,
)
from equivci.translate.builder import Builder, Value, moves_unit_dims_only
from equivci.translate.opaque import opaque

IDENTITY_CUSTOM_CALLS = {
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape",
    "xla.sdy.FuncResultSharding",
    "X64Combine",
    "LayoutConstraint",
}


def same(ev: Builder, inst: Instruction, args: list, device: int):
    """copy and opt-barrier: their operand."""
    return args[0]


def custom_call(ev: Builder, inst: Instruction, args: list, device: int):
    if custom_call_target(inst.attrs) in IDENTITY_CUSTOM_CALLS:
        return args[0]
    return opaque(ev, inst, args)


def tuple_(ev: Builder, inst: Instruction, args: list, device: int) -> tuple:
    return tuple(args)


def get_tuple_element(ev: Builder, inst: Instruction, args: list, device: int):
    value = args[0]
    index = int(inst.attrs["index"])
    if isinstance(value, tuple):
        return value[index]
    return ev.mk("gte", (index,), (value,), inst.shape)


def broadcast(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    return broadcast_term(ev, args[0], inst.shape, dims_attr(inst.attrs.get("dimensions")))


def reshape(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    """reshape and bitcast (of a layout XLA can express as a reshape)."""
    if reshape_spec(args[0].shape, inst.shape.dims) is None:
        return opaque(ev, inst, args)
    term = ev.reshape_term(args[0], inst.shape)
    if (moved := unit_dims_moved(ev, unit_moves_undone(args[0]), inst.shape)) is not None and moved is not term:
        ev.equal_terms.append([term, moved])
    return term


def unit_moves_undone(x: Term) -> Term:
    """x's operand when x is a transpose that moves only size-1 dims (the others keep their order):
    such a transpose moves no element, so a reshape of it is the same reshape of its operand. XLA's
    partitioner writes a device's one head merged back, `o.transpose(0, 2, 1, 3).reshape(b, s, hd)`,
    as that transpose of its [b, 1, s, hd] slab before the reshape, where a shard_map writes the
    reshape alone; x itself otherwise."""
    if x.op != "transpose":
        return x
    y = x.args[0]
    return y if moves_unit_dims_only(y.shape, parse_transpose(x.attrs[0])) else x


def unit_dims_moved(ev: Builder, x: Term, out: Shape) -> Term | None:
    """A reshape that only drops size-1 dims of x, as the same reshape of x with those dims first
    moved to just before its last dim by a transpose, where splitting a projection's last dim into
    heads puts the head dim ([b, s, h, hd]):

        squeeze(x) = reshape(transpose(x, p))   for p moving only size-1 dims

    (moving a size-1 dim moves no element). A device holding one head of
    `out.transpose(0, 2, 1, 3).reshape(b, s, h * hd)`, which XLA writes as a reshape of its
    [b, 1, s, hd] slab, then meets the reference's transpose and merge of its heads at that head's
    window. None when x has fewer than three dims, the reshape does more than drop size-1 dims, one
    of them trails x's last dim or leads its first kept dim, or none stands before the dim that precedes
    its last."""
    if len(x.shape) < 3 or ev.folded(x) is not None:
        return None
    units = [d for d, n in enumerate(x.shape) if n == 1]
    kept = [d for d, n in enumerate(x.shape) if n != 1]
    if not units or len(kept) < 2 or tuple(x.shape[d] for d in kept) != out.dims:
        return None
    if max(units) > kept[-1] or min(units) > kept[-2]:
        return None  # a trailing size-1 dim (keepdims statistics) is no head; one in place moves nothing
    if min(units) < kept[0]:
        # a leading size-1 dim is a slice's row (a scan's microbatch, a vmapped row), no head: stated
        # moved, every step of a scan grew the e-graph past its budget (near miss fsdp-scan)
        return None
    perm = tuple(kept[:-1] + units + kept[-1:])
    moved = ev.mk("transpose", (transpose_text(perm),), [x], Shape(x.dtype, tuple(x.shape[d] for d in perm)))
    return ev.mk("reshape", (reshape_spec(moved.shape, out.dims),), [moved], out)


def transpose(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    return ev.transpose_term(args[0], dims_attr(inst.attrs.get("dimensions")))


def slice_(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    ranges = re.findall(r"\[(-?\d+):(-?\d+)(?::(\d+))?\]", inst.attrs["slice"])
    x = args[0]
    for dim, (a, b, step) in enumerate(ranges):
        if step not in ("", "1"):
            strided = strided_slice(ev, x, dim, int(a), int(b), int(step))
            if strided is None:
                return opaque(ev, inst, args)
            x = strided
    return window(
        ev, x, [(int(a), int(b)) if step in ("", "1") else (0, x.shape[dim]) for dim, (a, b, step) in enumerate(ranges)]
    )


def dynamic_slice(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    sizes = dims_attr(inst.attrs.get("dynamic_slice_sizes"))
    starts = [ev.folded(a) for a in args[1:]]
    symbolic = [dim for dim, s in enumerate(starts) if s is None]
    x = args[0]
    offsets.note_starts(ev, inst, x, args[1:], sizes)
    if len(symbolic) > 1:
        return opaque(ev, inst, args)
    ranges = []
    for dim, (s, size) in enumerate(zip(starts, sizes)):
        start = 0 if s is None else int(np.clip(int(s), 0, x.shape[dim] - size))  # HLO clamps starts
        ranges.append((start, start + size))
    if symbolic:
        dim = symbolic[0]
        x = dynamic_window(ev, x, dim, args[1 + dim], sizes[dim])
        ranges[dim] = (0, sizes[dim])
    return window(ev, x, ranges)


def window(ev: Builder, x: Term, ranges: list[tuple[int, int]]) -> Term:
    """x's window `ranges`; of copies, the copies of a window when it is one (copies_window), the
    written window stated beside it."""
    written = ev.slice_nd(x, ranges)
    if written.shape == x.shape or (term := copies_window(ev, x, ranges)) is None:
        return written
    if term.op == "reshape" and term.args[0].op == "bcast":
        # (Not where the window holds each element once: y's window stated equal to a window of a
        # broadcast of y is a cycle the layout rules follow forever, the copies growing each pass.)
        ev.equal_terms.append([term, written])
    return term


def copies_window(ev: Builder, x: Term, ranges: list[tuple[int, int]]) -> Term | None:
    """The window `ranges` of copies x (bcast(y), or a reshape of it: `jnp.repeat`, a tile) as the
    same copies of a window of y, when it is one (tiles.copied_window): a device's two query heads
    of one KV head cut from a repeat of every KV head are that head's keys twice. None otherwise."""
    copies = x.args[0] if x.op == "reshape" else x
    if ev.folded(x) is not None:
        return None
    found = tiles.copied_window(copies, x.shape, ranges, ev.budgets.layout_labels)
    if found is None:
        return None
    part = ev.slice_nd(copies.args[0], found.box)
    shape = Shape(x.dtype, tuple(b - a for a, b in ranges))
    if np.prod(found.shape) == np.prod(part.shape):  # each element once: y's window itself
        return ev.reshape_term(part, shape)
    return ev.reshape_term(broadcast_term(ev, part, Shape(x.dtype, found.shape), found.dims), shape)


def concatenate(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    dim = dims_attr(inst.attrs.get("dimensions"))[0]
    values = [v for a in args if (v := ev.folded(a)) is not None]
    if len(values) == len(args):
        return ev.const(np.concatenate(values, axis=dim), inst.shape.dtype)
    return ev.concat(list(args), dim)


def pad(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    """pad(x, c) without interior padding: x between broadcasts of c along each dim (a negative
    amount cuts x instead); interior padding stays opaque."""
    x, fill = args
    padding = inst.attrs.get("padding", "")
    try:
        amounts = [tuple(int(v) for v in part.split("_")) for part in padding.split("x")] if padding else []
    except ValueError:
        return opaque(ev, inst, args)
    if len(amounts) != len(x.shape) or any(len(a) not in (2, 3) or a[2:] not in ((), (0,)) for a in amounts):
        return opaque(ev, inst, args)
    for dim, (low, high, *_) in enumerate(amounts):
        x = padded(ev, x, dim, low, high, fill)
    return x


def padded(ev: Builder, x: Term, dim: int, low: int, high: int, fill: Term) -> Term:
    """x between `low` and `high` copies of the scalar `fill` along `dim` (a negative amount cuts x)."""
    x = ev.slice_term(x, dim, max(0, -low), x.shape[dim] - max(0, -high))
    parts = []
    for size in (low, high):
        shape = list(x.shape)
        shape[dim] = size
        parts.append(broadcast_term(ev, fill, Shape(x.dtype, tuple(shape)), ()) if size > 0 else None)
    return ev.concat([t for t in (parts[0], x, parts[1]) if t is not None], dim) if any(parts) else x


def scatter(ev: Builder, inst: Instruction, args: list, device: int):
    handlers = (
        scatter_at_constants,
        index_writes.one_window,
        scatter_adds.per_row,
        scatter_adds.windows,
        one_hots.columns,
        row_writes.selected,
    )
    for handler in handlers:
        if (written := handler(ev, inst, args)) is not None:
            return written
    term = opaque(ev, inst, args)
    combiner = row_scatter(ev, inst, args)
    if combiner is not None and isinstance(term, Term):
        ev.row_scatters[term] = combiner
    return term


def row_scatter(ev: Builder, inst: Instruction, args: list) -> str | None:
    """ "add" or "set" when the scatter writes whole rows, out[idx[b], ...] op= update[b, ...]
    (indices [n, 1], the rows of the update its first dim), else None."""
    if len(args) != 3 or inst.shape.is_tuple:
        return None
    x, idx, update = args
    attrs = inst.attrs
    rank = len(x.shape)
    if (
        attrs.get("input_batching_dims")
        or int(attrs.get("index_vector_dim", len(idx.shape))) != 1
        or len(idx.shape) != 2
        or idx.shape[1] != 1
        or dims_attr(attrs.get("inserted_window_dims")) != (0,)
        or dims_attr(attrs.get("scatter_dims_to_operand_dims")) != (0,)
        or dims_attr(attrs.get("update_window_dims")) != tuple(range(1, rank))
        or update.shape != (idx.shape[0], *x.shape[1:])
    ):
        return None
    if reducer_of(ev.module, inst) == "add":
        return "add"
    return "set" if overwrites(called(ev.module, inst, "to_apply")) else None


def strided_slice(ev: Builder, x: Term, dim: int, start: int, stop: int, step: int) -> Term | None:
    """x[start:stop:step] along `dim` as windows of x with `dim` split into (n / step, step):
    element i of the result is x's start + i * step, row (start // step + i), column start % step.
    Interleaved RoPE's x[..., 1::2] is then a window like any other, which slices of the other
    dims pass through. None when step does not divide the dim."""
    n = x.shape[dim]
    count = len(range(start, stop, step))
    if n % step or count == 0:
        return None
    split = Shape(x.dtype, x.shape[:dim] + (n // step, step) + x.shape[dim + 1 :])
    grid = ev.reshape_term(x, split)
    row, column = divmod(start, step)
    picked = ev.slice_term(ev.slice_term(grid, dim + 1, column, column + 1), dim, row, row + count)
    out = list(x.shape)
    out[dim] = count
    return ev.reshape_term(picked, Shape(x.dtype, tuple(out)))


def broadcast_term(ev: Builder, operand: Term, shape: Shape, dims: tuple[int, ...]) -> Term:
    if dims == tuple(range(len(shape.dims))) and operand.shape == shape.dims:
        return operand
    if list(dims) == sorted(dims) and all(shape.dims[o] == n for o, n in zip(dims, operand.shape)):
        if all(shape.dims[o] == 1 for o in range(len(shape.dims)) if o not in dims):
            # A broadcast that only inserts size-1 dims keeps the elements in order: a reshape (a
            # device's one-row window of a repeat has a size-1 copy dim; the reshape after it undoes it).
            return ev.reshape_term(operand, shape)
    expanded = [i for i, o in enumerate(dims) if operand.shape[i] == 1 and shape.dims[o] != 1]
    units = [i for i in range(len(dims)) if operand.shape[i] == 1]
    if (
        operand.op == "reshape"
        and tuple(n for n in operand.shape if n != 1) == operand.args[0].shape
        and ev.folded(operand.args[0]) is not None
    ):
        # A constant reshaped only to add unit dims, then broadcast, is a broadcast of the constant
        # (a device's mask over its one batch row, where the reference broadcasts the mask itself).
        # Only a constant: a computed value's unit dim may be a device's window of a real dim (one
        # KV head of several), which the reference's operand keeps.
        expanded = units
    if expanded:
        # HLO may stretch a size-1 operand dim; as terms that is: drop the dim, then broadcast
        # along a new one (a spec must not mean two output shapes).
        keep = [i for i in range(len(dims)) if i not in expanded]
        squeezed = Shape(operand.dtype, tuple(operand.shape[i] for i in keep))
        operand = ev.reshape_term(operand, squeezed)
        dims = tuple(dims[i] for i in keep)
    value = ev.folded(operand)
    if value is not None and value.ndim == 0:
        return ev.const(np.broadcast_to(value, shape.dims), shape.dtype)
    factor, base = ev.scale_of(operand)
    if factor != 1 and (term := ev.scaled(broadcast_term(ev, base, shape, dims), factor)) is not None:
        return term
    # A broadcast table stays a broadcast (the reference's and a device's differ only in the
    # sizes of new dims, which the rules relate); its value is kept for folding.
    term = ev.mk("bcast", (bcast_spec(len(operand.shape), shape.dims, dims),), [operand], shape)
    if value is not None and np.prod(shape.dims) <= ev.budgets.fold_elements:
        laid_out = value.reshape([value.shape[dims.index(o)] if o in dims else 1 for o in range(len(shape.dims))])
        ev.values[term] = np.broadcast_to(laid_out, shape.dims)
    return term


def dynamic_window(ev: Builder, x: Term, dim: int, start: Term, size: int) -> Term:
    """`size` elements of `x` along `dim` from a start known only as a term (a loop counter)."""
    if size == x.shape[dim]:  # the start clamps to 0
        return x
    if (window := offsets.window(ev, x, dim, start, size)) is not None:
        return window
    shape = list(x.shape)
    shape[dim] = size
    return ev.mk("dslice", (dim, size), (x, start), Shape(x.dtype, tuple(shape)))


def dynamic_update_slice(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    x, update, *idx = args
    offsets.note_starts(ev, inst, x, idx, update.shape)
    starts = [ev.folded(a) for a in idx]
    symbolic = [d for d, s in enumerate(starts) if s is None]
    if symbolic:
        # One start known only as a term, the update whole along every other dim (a scan
        # writing its per-iteration output): the other starts clamp to 0.
        dim = symbolic[0]
        if len(symbolic) > 1 or any(update.shape[d] != x.shape[d] for d in range(len(x.shape)) if d != dim):
            return opaque(ev, inst, args)
        if update.shape == x.shape:
            return update
        return ev.mk("dupdate", (dim,), (x, update, idx[dim]), Shape(x.dtype, x.shape))
    known = [s for s in starts if s is not None]
    clamped = [int(np.clip(int(s), 0, n - u)) for s, n, u in zip(known, x.shape, update.shape)]
    return write_window(ev, x, update, clamped)


def scatter_at_constants(ev: Builder, inst: Instruction, args: list) -> Term | None:
    """A scatter that overwrites or adds, at indices known as constants, into windows that do not
    overlap: the operand with those windows replaced (`outs.at[k].set(y)` at an unrolled loop's
    step k) or increased (the gradient of a gather at a constant index). An index vector whose
    window leaves the operand writes nothing (XLA skips it, no clamping)."""
    if len(args) != 3 or inst.shape.is_tuple:
        return None
    adds = reducer_of(ev.module, inst) == "add"
    if not adds and not overwrites(called(ev.module, inst, "to_apply")):
        return None
    x, idx, update = args
    indices = ev.folded(idx)
    attrs = inst.attrs
    if indices is None or attrs.get("input_batching_dims") or any(a.dtype != x.dtype for a in (update,)):
        return None
    vector_dim = int(attrs["index_vector_dim"])
    window_dims = dims_attr(attrs.get("update_window_dims"))
    inserted = dims_attr(attrs.get("inserted_window_dims"))
    to_operand = dims_attr(attrs.get("scatter_dims_to_operand_dims"))
    if vector_dim == indices.ndim:
        indices = indices[..., None]
    else:
        indices = np.moveaxis(indices, vector_dim, -1)
    if indices.shape[:-1] and int(np.prod(indices.shape[:-1])) > 64:
        return None
    scatter_dims = [d for d in range(len(update.shape)) if d not in window_dims]
    operand_window = [d for d in range(len(x.shape)) if d not in inserted]
    sizes = [1] * len(x.shape)
    for d, u in zip(operand_window, window_dims):
        sizes[d] = update.shape[u]
    boxes: list[list[tuple[int, int]]] = []
    result = x
    for pos in np.ndindex(*indices.shape[:-1]):
        starts = [0] * len(x.shape)
        for k, d in enumerate(to_operand):
            starts[d] = int(indices[pos][k])
        if any(s < 0 or s + n > full for s, n, full in zip(starts, sizes, x.shape)):
            continue
        box = [(s, s + n) for s, n in zip(starts, sizes)]
        if any(all(a < d and c < b for (a, b), (c, d) in zip(box, other)) for other in boxes):
            return None  # overlapping writes: which one wins is unspecified
        boxes.append(box)
        ranges = [(0, n) for n in update.shape]
        for d, p in zip(scatter_dims, pos):
            ranges[d] = (p, p + 1)
        piece = ev.reshape_term(ev.slice_nd(update, ranges), Shape(x.dtype, tuple(sizes)))
        if adds and ev.uniform(here := ev.slice_nd(x, box)) != 0:
            piece = ev.binary("add", here, piece)
        result = write_window(ev, result, piece, starts)
    return result


def write_window(ev: Builder, x: Term, piece: Term, starts: list[int]) -> Term:
    """x with the block at `starts` replaced by `piece`: concatenations of x's windows and it."""
    differing = [d for d in range(len(x.shape)) if piece.shape[d] != x.shape[d]]
    if not differing:
        return piece
    d = differing[0]
    s, u = starts[d], piece.shape[d]
    band = (
        piece
        if differing == [d]
        else write_window(ev, ev.slice_term(x, d, s, s + u), piece, [0 if k == d else v for k, v in enumerate(starts)])
    )
    # x's parts along d around the band (x may be earlier writes), so writes compose flat
    before, after, lo = [], [], 0
    for part in pieces.parts_along(x, d):
        hi = lo + part.shape[d]
        if lo < s:
            before.append(ev.slice_term(part, d, 0, min(hi, s) - lo))
        if hi > s + u:
            after.append(ev.slice_term(part, d, max(lo, s + u) - lo, hi - lo))
        lo = hi
    return ev.concat(merged(ev, before + [band] + after, d), d)


def merged(ev: Builder, parts: list[Term], d: int) -> list[Term]:
    """Adjacent parts that are one window together joined: contiguous slices of one term along
    `d`, or constants of one value, so that writes in any order build the same concatenation."""
    out: list[Term] = []
    for part in parts:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.op == part.op == "slice"
            and prev.args[0] is part.args[0]
            and prev.attrs[0] == part.attrs[0] == d
            and prev.attrs[2] == part.attrs[1]
        ):
            out[-1] = ev.slice_term(part.args[0], d, prev.attrs[1], part.attrs[2])
            continue
        a, b = (ev.uniform(prev), ev.uniform(part)) if prev is not None else (None, None)
        if a is not None and a == b and prev is not None and prev.dtype == part.dtype:
            shape = list(part.shape)
            shape[d] += prev.shape[d]
            out[-1] = ev.const(np.full(shape, cast(np.ndarray, ev.folded(part)).flat[0]), part.dtype)
            continue
        out.append(part)
    return out


def gather(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    """A gather is independent along its index dims (a batched gather also along the operand's
    batching dims): an aligned map. Unit index dims (take_along_axis keeps one) are reshaped
    away first, so that gathers of the same rows meet whatever their index layout."""
    x, idx = args
    attrs = semantic_attrs(inst, ev.module)
    if attrs.get("indices_are_sorted", "false") != "false" or attrs.get("unique_indices", "false") != "false":
        return opaque(ev, inst, args)
    dims = GatherDims.parse(attrs, len(idx.shape))
    if (window := gather_at_constant(ev, x, idx, dims, inst.shape)) is not None:
        return window
    if (windows := rows_at_constants(ev, x, idx, dims, inst.shape)) is not None:
        return windows
    dims, kept_idx, kept_out = dims.without_unit_index_dims(idx.shape, len(inst.shape.dims))
    out = Shape(inst.shape.dtype, tuple(inst.shape.dims[o] for o in kept_out))
    dims, idx_shape = dims.unit_windows_batched(x.shape, tuple(idx.shape[j] for j in kept_idx), len(out.dims))
    idx = ev.reshape_term(idx, Shape(idx.dtype, idx_shape))
    if len(dims.start_map) == 1:
        ev.index_uses.append((idx, x.shape[dims.start_map[0]], (inst, *reversed(ev.calls))))
    if (rows := offsets.consecutive_rows(ev, x, idx, dims, out)) is not None:
        return ev.reshape_term(rows, inst.shape)
    if (picked := iota_at(ev, x, idx, dims, out)) is not None:
        return ev.reshape_term(picked, inst.shape)
    term = ev.gather_term(x, idx, dims, out)
    if term is None:
        return opaque(ev, inst, args)
    lookup = masks.masked_lookup(ev, x, idx, dims, out)
    if lookup is not None:
        ev.masked_rows[term] = lookup
    ev.equal_terms.extend(picks.one_hot_facts(ev, term, x, idx, dims, out))
    if (product := picks.row_one_hot_dot(ev, x, idx, dims, out)) is not None:
        ev.equal_terms.append([term, product])
    if (top := picks.max_pick(ev, x, idx, dims, out)) is not None:
        ev.equal_terms.append([term, top])
    if (winner := argmax_pieces.combined_argmax(ev, x, idx, dims, out)) is not None:
        ev.equal_terms.append([term, winner])
    if (ordered := picks.sorted_pick(ev, x, idx, dims, out)) is not None:
        ev.equal_terms.append([term, ordered])
    if (unreshaped := gathers.reshaped_index(ev, x, idx, dims, out)) is not None:
        ev.equal_terms.append([term, unreshaped])
    return ev.reshape_term(term, inst.shape)


def iota_at(ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """arange(n)[i] = i for indices known to lie in [0, n) (`jnp.arange(E)[ids]`, jnp.repeat's
    take): the gather of single elements of an iota table is its index."""
    table, bounds = ev.folded(x), ev.bounds_of(idx)
    if (
        table is None
        or bounds is None
        or len(x.shape) != 1
        or not np.array_equal(table, np.arange(x.shape[0]))
        or dims.collapsed != (0,)
        or dims.start_map != (0,)
        or dims.operand_batch
        or dims.slice_sizes != (1,)
        or [s for k, s in enumerate(idx.shape) if k != dims.vector_dim] != list(out.dims)
        or bounds[0] < 0
        or bounds[1] >= x.shape[0]
    ):
        return None
    # the index vector (of length 1) is the only dim the output drops
    flat = ev.reshape_term(idx, Shape(idx.dtype, out.dims))
    return flat if flat.dtype == out.dtype else ev.normal("unary", ("convert",), (flat,), out)


def gather_at_constant(ev: Builder, x: Term, idx: Term, dims: GatherDims, shape: Shape) -> Term | None:
    """A gather of one window at a start known as a constant (`y[..., 0]` written as a gather):
    that static window, clamped into the operand as HLO clamps it, its collapsed dims and the
    unit batch dims reshaped, since offset dims keep the operand's order."""
    indices = ev.folded(idx)
    if indices is None or dims.operand_batch or x.dtype != shape.dtype:
        return None
    vectors = indices[..., None] if dims.vector_dim == indices.ndim else np.moveaxis(indices, dims.vector_dim, -1)
    if vectors.size != len(dims.start_map) or len(dims.slice_sizes) != len(x.shape):
        return None
    starts = [0] * len(x.shape)
    for k, start in zip(dims.start_map, vectors.reshape(-1)):
        starts[k] = min(max(int(start), 0), x.shape[k] - dims.slice_sizes[k])
    ranges = [(s, s + n) for s, n in zip(starts, dims.slice_sizes)]
    return ev.reshape_term(ev.slice_nd(x, ranges), shape)


def rows_at_constants(ev: Builder, x: Term, idx: Term, dims: GatherDims, shape: Shape) -> Term | None:
    """A gather of single rows along one dim k at a constant index vector whose result keeps x's
    dim order (`x[:, order]`, `jnp.take(x, order, axis=1)`: a zigzag layout's static permutation of
    sequence chunks) is the concatenation along k of the windows of x that its runs of consecutive
    indices read, each index clamped into [0, n - 1] as HLO clamps a start; at most
    `Budgets.taken_runs` windows (a shuffle of single rows stays a gather)."""
    indices = ev.folded(idx)
    if indices is None or dims.operand_batch or len(dims.start_map) != 1 or x.dtype != shape.dtype:
        return None
    k = dims.start_map[0]
    if dims.collapsed != (k,) or [n for j, n in enumerate(dims.slice_sizes) if j != k] != [
        n for j, n in enumerate(x.shape) if j != k
    ]:
        return None
    if dims.vector_dim < indices.ndim:
        if indices.shape[dims.vector_dim] != 1:
            return None
        indices = np.take(indices, 0, axis=dims.vector_dim)
    if indices.ndim != 1 or [o for o in range(len(shape.dims)) if o not in dims.offset] != [k]:
        return None
    rows = np.clip(indices.astype(np.int64), 0, x.shape[k] - 1)
    starts = [0, *[j for j in range(1, len(rows)) if rows[j] != rows[j - 1] + 1]]
    if len(starts) > ev.budgets.taken_runs:
        return None
    ends = [*starts[1:], len(rows)]
    parts = [ev.slice_term(x, k, int(rows[a]), int(rows[a]) + b - a) for a, b in zip(starts, ends)]
    return ev.concat(parts, k)


HANDLERS = {
    "copy": same,
    "opt-barrier": same,
    "custom-call": custom_call,
    "tuple": tuple_,
    "get-tuple-element": get_tuple_element,
    "broadcast": broadcast,
    "reshape": reshape,
    "bitcast": reshape,
    "transpose": transpose,
    "slice": slice_,
    "dynamic-slice": dynamic_slice,
    "dynamic-update-slice": dynamic_update_slice,
    "concatenate": concatenate,
    "pad": pad,
    "gather": gather,
    "scatter": scatter,
}
