"""The handler of `convolution`: a convolution is a dot of its input's windows (im2col) with its
kernel,

    conv(x, w)[b, o.., f] = sum over (c, k..) of pad(x)[b, o · s + k · r.., c] · w[k.., c, f]

(s the window strides, r the kernel dilations; feature_group_count = batch_group_count = 1, no
input dilation, no window reversal), so it is built as that dot: each spatial dim of the padded
input split into (output position, window offset), the offsets contracted with the kernel's
spatial dims and the input features with its input features. Every fact the other handlers know
of dots then holds of convolutions: a device's input-feature shard against the matching kernel
rows is a partial sum of the reference's convolution, output-feature and batch shards are its
windows, a halo-extended time shard convolved without padding is a window of the padded whole,
and a stride-p convolution with a p-wide window is the dot of the input's non-overlapping patches
that a reshape makes. A depthwise convolution (feature_group_count = features, one output per
group) is the sum over window offsets of the padded input's window times the kernel's row there
(`depthwise`). Other convolutions stay opaque.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.translate import reductions, shapes
from equivci.translate.builder import Builder, Value
from equivci.translate.opaque import opaque


@dataclasses.dataclass(frozen=True)
class ConvDims:
    """A convolution's dim labels (`b0f_0io->b0f`) and window, one entry per spatial dim."""

    lhs: str
    rhs: str
    out: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]  # of the kernel (rhs_dilate)
    groups: int = 1  # feature_group_count


def conv_dims(attrs: dict[str, str]) -> ConvDims | None:
    """The dims of a convolution this module builds; None for batch-grouped convolutions, input
    dilation (a transposed convolution) and window reversal."""
    labels = re.fullmatch(r"(\w+)_(\w+)->(\w+)", attrs.get("dim_labels", ""))
    if labels is None or attrs.get("batch_group_count", "1") != "1":
        return None
    fields = dict(f.split("=", 1) for f in attrs.get("window", "").strip("{}").split() if "=" in f)
    if set(fields) - {"size", "stride", "pad", "rhs_dilate", "lhs_dilate", "rhs_reversal"}:
        return None
    lhs, rhs, out = labels.groups()
    n = len(lhs) - 2
    per_dim = {key: fields[key].split("x") if key in fields else None for key in fields}
    if any(len(v) != n for v in per_dim.values() if v is not None):
        return None
    if any(v != "1" for v in per_dim.get("lhs_dilate") or ()) or any(
        v != "0" for v in per_dim.get("rhs_reversal") or ()
    ):
        return None

    def ints(key: str, default: int) -> tuple[int, ...]:
        values = per_dim.get(key)
        return tuple(int(v) for v in values) if values else (default,) * n

    pad_texts = [p.split("_") for p in per_dim.get("pad") or ["0_0"] * n]
    if any(len(p) != 2 for p in pad_texts):
        return None
    pads = tuple((int(lo), int(hi)) for lo, hi in pad_texts)
    groups = attrs.get("feature_group_count", "1")
    if not groups.isdigit():
        return None
    return ConvDims(lhs, rhs, out, ints("size", 1), ints("stride", 1), pads, ints("rhs_dilate", 1), int(groups))


def convolution(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    dims = conv_dims(inst.attrs)
    if dims is None or inst.shape.is_tuple:
        return opaque(ev, inst, args)
    x, w = args
    if dims.groups != 1:
        return depthwise(ev, inst, dims, x, w) or opaque(ev, inst, args)
    layout: list[tuple[str, str]] = [("x", c) for c in dims.lhs]  # the patches' dims, as they are built
    for i in range(len(dims.size)):
        at = layout.index(("x", str(i)))
        out_size = inst.shape.dims[dims.out.index(str(i))]
        split = window_offsets(ev, x, at, dims.size[i], dims.stride[i], dims.dilation[i], dims.pad[i], out_size)
        if split is None:
            return opaque(ev, inst, args)
        x, in_place = split
        # the offsets beside the positions where a reshape split them, else last (see window_offsets)
        layout[at : at + 1] = [("o", str(i)), ("k", str(i))] if in_place else [("o", str(i))]
        layout += [] if in_place else [("k", str(i))]
    contracted = [("x", "f")] + [("k", str(i)) for i in range(len(dims.size))]
    lhs_contract = tuple(layout.index(d) for d in contracted)
    rhs_contract = tuple(dims.rhs.index(c) for c in "i" + "".join(str(i) for i in range(len(dims.size))))
    # the dot's dims: the patches' free dims in order (batch, output positions), then the kernel's
    # output features, named by the convolution's output labels
    free = [d for d in layout if d not in contracted]
    names = ["b" if d == ("x", "b") else d[1] for d in free] + ["f"]
    sizes = [x.shape[layout.index(d)] for d in free] + [w.shape[dims.rhs.index("o")]]
    dot = Instruction(
        inst.name,
        "dot",
        Shape(inst.shape.dtype, tuple(sizes)),
        (),
        {"lhs_contracting_dims": _dims_text(lhs_contract), "rhs_contracting_dims": _dims_text(rhs_contract)},
    )
    term = reductions.dot(ev, dot, [x, w], device)
    return ev.transpose_term(term, tuple(names.index(c) for c in dims.out))


def depthwise(ev: Builder, inst: Instruction, dims: ConvDims, x: Term, w: Term) -> Term | None:
    """A depthwise convolution (one group per input feature, one output feature per group) as the
    sum over window offsets k.. of the padded input's window at k.. times the kernel's row at k..,

        conv(x, w)[b, o.., f] = sum over k.. of pad(x)[b, o · s + k · r.., f] · w[k.., 0, f],

    added in offset order: a depthwise convolution written by hand as a sum of shifted slices is
    then the same sum, and a device's feature or batch shard a window of each term. None for other
    grouped convolutions."""
    features = x.shape[dims.lhs.index("f")]
    if not (dims.groups == features == inst.shape.dims[dims.out.index("f")] and w.shape[dims.rhs.index("i")] == 1):
        return None
    spatial = [str(i) for i in range(len(dims.size))]
    for i, c in enumerate(spatial):
        zero = _zero(ev, x.dtype)
        x = shapes.padded(ev, x, dims.lhs.index(c), *dims.pad[i], zero)
    ev.inner_values.extend(_padding(x))
    perm = tuple(dims.lhs.index(c) for c in dims.out)
    total = None
    for offsets in itertools.product(*(range(n) for n in dims.size)):
        window = x
        for i, (c, k) in enumerate(zip(spatial, offsets)):
            at, out = dims.lhs.index(c), inst.shape.dims[dims.out.index(c)]
            start = k * dims.dilation[i]
            stop = start + (out - 1) * dims.stride[i] + 1
            if stop > window.shape[at]:
                return None
            step = dims.stride[i] if out > 1 else 1
            cut = ev.slice_term(window, at, start, stop) if step == 1 else strided(ev, window, at, start, stop, step)
            if cut is None:
                return None
            window = cut
        row = ev.slice_nd(w, [(k, k + 1) if c in spatial else (0, n) for c, n, k in _kernel_dims(dims, w, offsets)])
        row = ev.reshape_term(row, Shape(w.dtype, (features,)))
        term = ev.binary(
            "multiply",
            ev.transpose_term(window, perm),
            shapes.broadcast_term(ev, row, inst.shape, (dims.out.index("f"),)),
            inst.shape.dtype,
        )
        total = term if total is None else ev.binary("add", total, term, inst.shape.dtype)
    return total


def strided(ev: Builder, x: Term, at: int, start: int, stop: int, step: int) -> Term | None:
    """x[start:stop:step] along `at`, x first cut or zero-padded to a multiple of `step`."""
    end = -(-x.shape[at] // step) * step
    zero = _zero(ev, x.dtype)
    x = shapes.padded(ev, x, at, 0, end - x.shape[at], zero)
    return shapes.strided_slice(ev, x, at, start, stop, step)


def _kernel_dims(dims: ConvDims, w: Term, offsets: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """The kernel's dims in order: label, size, and the window offset for its spatial dims."""
    return [(c, n, offsets[int(c)] if c.isdigit() else 0) for c, n in zip(dims.rhs, w.shape)]


def window_offsets(
    ev: Builder, x: Term, at: int, size: int, stride: int, dilation: int, pad: tuple[int, int], out: int
) -> tuple[Term, bool] | None:
    """x padded by `pad` zeros along dim `at`, that dim turned into `out` positions and a new dim of
    `size` window offsets: element [o, k] is the padded x's o · stride + k · dilation. True with it
    where the offsets follow the positions (non-overlapping windows: a reshape), False where they
    are a new last dim, one window of x per offset: joined beside the features, such windows would
    be one reshape of their concatenation along the features, a contraction merged with the
    features that a device's feature window is no window of. None where the window does not give
    `out` positions."""
    zero = _zero(ev, x.dtype)
    x = shapes.padded(ev, x, at, *pad, zero)
    n = x.shape[at]
    if n < (size - 1) * dilation + 1 or (n - (size - 1) * dilation - 1) // stride + 1 != out:
        return None
    if stride == size and dilation == 1:
        # non-overlapping windows (a patch embedding): the dim reshaped, no copies
        patches, in_place = _split(ev, ev.slice_term(x, at, 0, out * size), at, out, size), True
    else:
        patches, in_place = _offsets_last(ev, x, at, size, stride, dilation, out), False
    ev.inner_values.extend(_padding(patches))
    return patches, in_place


def _offsets_last(ev: Builder, x: Term, at: int, size: int, stride: int, dilation: int, out: int) -> Term:
    """x's dim `at` as `out` positions, a new last dim the `size` window offsets."""
    zero = _zero(ev, x.dtype)
    n = x.shape[at]
    step = stride if out > 1 else 1
    parts = []
    for k in range(size):
        start = k * dilation
        # elements start, start + step, ...: column c of the rows of [start - c, start - c + out · step)
        # split by `step`, with c the last that keeps that window inside x (step - 1 where it can:
        # the window ends at the last element read, so a device whose halo'd shard stops there cuts
        # the same rows as the reference); where none does, column 0 of [start, n) followed by zeros
        # that no column 0 reads
        columns = range(max(0, start + out * step - n), min(step - 1, start) + 1)
        c = columns[-1] if columns else 0
        rows = ev.slice_term(x, at, start - c, min(n, start - c + out * step))
        rows = shapes.padded(ev, rows, at, 0, out * step - rows.shape[at], zero)
        picked = ev.slice_term(_split(ev, rows, at, out, step), at + 1, c, c + 1)
        parts.append(ev.reshape_term(picked, Shape(x.dtype, picked.shape[: at + 1] + picked.shape[at + 2 :] + (1,))))
    return ev.concat(parts, len(x.shape))


def _padding(patches: Term) -> list[Term]:
    """The zeros of the padding among the pieces the windows are cut from: in the
    reference, values that a device's narrower zeros (its feature shard's) are windows of."""
    found, stack, seen = [], [patches], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t.op in ("concat", "reshape", "slice"):
            stack.extend(t.args)
        elif t.op == "bcast" and t.args[0].op == "const":
            found.append(t)
    return found


def _zero(ev: Builder, dtype: str) -> Term:
    """The padding's zero, held in its dtype: the numeric hints compare values dtype by dtype."""
    return ev.const(np.zeros((), NP_DTYPES.get(dtype, np.float32)), dtype)


def _split(ev: Builder, x: Term, at: int, rows: int, columns: int) -> Term:
    return ev.reshape_term(x, Shape(x.dtype, x.shape[:at] + (rows, columns) + x.shape[at + 1 :]))


def _dims_text(dims: tuple[int, ...]) -> str:
    return "{" + ",".join(map(str, dims)) + "}"


HANDLERS = {"convolution": convolution}
