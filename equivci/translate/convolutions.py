"""Handler of convolution: a convolution whose window tiles its input (stride = window size along
every spatial dim, no padding, no dilation, no reversal, no feature or batch groups) is a patchify
followed by a dot. Each output element reads its own patch,
out[b, o, y_0, ...] = sum over i, k_0, ... of lhs[b, i, y_0 * s_0 + k_0, ...] * rhs[o, i, k_0, ...],
so cutting every spatial dim into (outputs, window) and moving the window dims beside the input
feature gives the patches; the convolution is their dot with the kernel, both with (i, k_0, ...)
merged into one contracted dim. A strided `conv_general_dilated` patch embedding and the same
patchify written with reshapes and transposes then meet as one term. Other convolutions stay opaque.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.spec import DotSpec
from equivci.translate.builder import Builder, Value
from equivci.translate.opaque import opaque
from equivci.translate.reductions import dot_of


@dataclasses.dataclass(frozen=True)
class Labels:
    """Where a convolution's dims are: (batch or output feature, feature, spatial dims in order)."""

    first: int
    feature: int
    spatial: tuple[int, ...]


def _labels(text: str, first: str, feature: str) -> Labels | None:
    spatial = sorted((int(c), k) for k, c in enumerate(text) if c.isdigit())
    if first not in text or feature not in text or [s for s, _ in spatial] != list(range(len(spatial))):
        return None
    return Labels(text.index(first), text.index(feature), tuple(k for _, k in spatial))


def _tiling_windows(inst: Instruction, rank: int) -> tuple[int, ...] | None:
    """The window sizes when every window is its stride and nothing pads, dilates or reverses."""
    fields = dict(f.split("=", 1) for f in inst.attrs.get("window", "").strip("{}").split() if "=" in f)
    sizes = tuple(int(s) for s in fields.pop("size", "").split("x") if s)
    strides = tuple(int(s) for s in fields.pop("stride", "x".join("1" * len(sizes))).split("x"))
    pads = re.findall(r"-?\d+", fields.pop("pad", ""))
    if fields or len(sizes) != rank or strides != sizes or any(int(p) for p in pads):
        return None
    if any(inst.attrs.get(k, "1") != "1" for k in ("feature_group_count", "batch_group_count")):
        return None
    return sizes


def convolution(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    lhs, rhs = args
    parts = inst.attrs.get("dim_labels", "").replace("->", "_").split("_")
    if len(parts) != 3:
        return opaque(ev, inst, args)
    lab, kab, oab = _labels(parts[0], "b", "f"), _labels(parts[1], "o", "i"), _labels(parts[2], "b", "f")
    if lab is None or kab is None or oab is None:
        return opaque(ev, inst, args)
    n = len(lab.spatial)
    windows = _tiling_windows(inst, n) if len(kab.spatial) == len(oab.spatial) == n else None
    if windows is None or any(rhs.shape[d] != w for d, w in zip(kab.spatial, windows)):
        return opaque(ev, inst, args)
    counts = tuple(inst.shape.dims[d] for d in oab.spatial)
    patches = _outside(ev, lhs, lambda x: _patches(ev, x, lab, windows, counts))
    kernel = _outside(ev, rhs, lambda k: _kernel(ev, k, kab))
    spec = DotSpec((), (), (n + 1,), (0,), n + 2, 2, (patches.dtype, kernel.dtype))
    dot_dims = (lhs.shape[lab.first], *counts, rhs.shape[kab.first])
    out = dot_of(ev, spec, patches, kernel, Shape(inst.shape.dtype, dot_dims))
    # the dot's dims are (b, spatial..., o); output dim d is the dot's dim at its label's place
    place = {oab.first: 0, **{d: 1 + s for s, d in enumerate(oab.spatial)}, oab.feature: n + 1}
    return ev.transpose_term(out, tuple(place[d] for d in range(n + 2)))


def _outside(ev: Builder, x: Term, relayout: Callable[[Term], Term]) -> Term:
    """relayout(x) with x's elementwise unary ops (a rounding to bf16) applied after it: each
    element is moved alone, so an image rounded before the patchify and patches rounded after it
    are one term, as are a kernel laid out before or after its rounding."""
    if x.op != "unary":
        return relayout(x)
    inner = _outside(ev, x.args[0], relayout)
    return ev.normal("unary", x.attrs, [inner], Shape(x.dtype, inner.shape))


def _kernel(ev: Builder, rhs: Term, kab: Labels) -> Term:
    """The kernel as [i * k_0 * ..., o]: its rows in the patches' order."""
    kernel = ev.transpose_term(rhs, (kab.feature, *kab.spatial, kab.first))
    return ev.reshape_term(kernel, Shape(rhs.dtype, (math.prod(kernel.shape[:-1]), kernel.shape[-1])))


def _patches(ev: Builder, lhs: Term, lab: Labels, windows: tuple[int, ...], counts: tuple[int, ...]) -> Term:
    """lhs as [b, y_0, ..., i * k_0 * ...]: each spatial dim cut into (count, window), the window
    dims moved beside the feature (the rows past the last whole window dropped, as the convolution
    does)."""
    cut = dict(zip(lab.spatial, (c * w for c, w in zip(counts, windows))))
    x = ev.slice_nd(lhs, [(0, cut.get(d, size)) for d, size in enumerate(lhs.shape)])
    split: list[int] = []
    where: dict[int, int] = {}
    for d, size in enumerate(x.shape):
        where[d] = len(split)
        if d in lab.spatial:
            s = lab.spatial.index(d)
            split += [counts[s], windows[s]]
        else:
            split.append(size)
    x = ev.reshape_term(x, Shape(x.dtype, tuple(split)))
    order = (
        where[lab.first],
        *(where[d] for d in lab.spatial),
        where[lab.feature],
        *(where[d] + 1 for d in lab.spatial),
    )
    x = ev.transpose_term(x, order)
    merged = (*x.shape[: len(counts) + 1], math.prod(x.shape[len(counts) + 1 :]))
    return ev.reshape_term(x, Shape(x.dtype, merged))


HANDLERS = {"convolution": convolution}
