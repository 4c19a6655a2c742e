"""Windows lifted out of the ops that act independently along their dim.

A value computed from one window of a tensor by such ops is the same window of that computation on
the whole tensor: dot(h, W[:, s:e]) - bcast(m) is (dot(h, W) - bcast(m))[..., s:e] when m does not
vary along that dim. The evaluator's facts about windows (equivci.translate.masks: a lookup in a
window of a table, a max over windows that cover a dim) read values in this form, so that logits a
device computes from its shard of the unembedding are a window of the reference's logits, as logits
it is handed are. Each step is exact: elementwise ops (selects too), free dims of a dot, batch dims
of a dot whose operands are windows of one range there, broadcasts and transposes (which move the
dim), constant factors, and operands that are windows of the same range or constant along the dim.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Protocol

import numpy as np

from equivci.hlo.ir import Shape
from equivci.options import Budgets
from equivci.terms.ir import Term
from equivci.terms.spec import AlignedMap, BcastSpec, DotSpec, ReduceSpec, parse_transpose


@dataclasses.dataclass(frozen=True)
class Window:
    """The value equals `whole[start:stop]` along `dim`."""

    whole: Term
    dim: int
    start: int
    stop: int


class Evaluator(Protocol):
    """What lifting needs of the evaluator (equivci.translate.evaluator.Evaluator)."""

    budgets: Budgets
    window_forms: dict[tuple[Term, int], "Window | None"]

    def mk(self, op: str, attrs: tuple, args: tuple, shape: Shape) -> Term: ...

    def folded(self, term: Term) -> np.ndarray | None: ...

    def const(self, value: np.ndarray, dtype: str) -> Term: ...

    def scale_of(self, t: Term) -> tuple[Fraction, Term]: ...

    def scaled(self, base: Term, factor: Fraction) -> Term | None: ...

    def slice_term(self, x: Term, dim: int, start: int, stop: int) -> Term: ...

    def reshape_term(self, operand: Term, shape: Shape) -> Term: ...


def window_form(ev: Evaluator, t: Term, depth: int = 0) -> Window | None:
    """`t` as a window of a (possibly new) term along one dim, when the ops that made it let the
    window through; None otherwise. Kept by (term, depth): a value read by both operands of many
    ops (a router's gates under two argmaxes) is walked once."""
    if (t, depth) not in ev.window_forms:
        ev.window_forms[(t, depth)] = _window_form(ev, t, depth)
    return ev.window_forms[(t, depth)]


def window_along(ev: Evaluator, t: Term, dim: int, depth: int = 0) -> Window | None:
    """`t` as a window along `dim`: its window form, or, where that form is a window along another
    dim k, the window along `dim` of its whole, the window along k taken of that window's whole:
    windows along two dims commute, x[a:b along k][c:d along dim] = x[c:d along dim][a:b along k]
    (a device's logits on a {data, vocab} mesh, its rows of h against its columns of the head, are
    its vocabulary window of its rows' logits)."""
    w = window_form(ev, t, depth)
    if w is None or w.dim == dim:
        return w
    if depth >= ev.budgets.window_depth:
        return None
    inner = window_along(ev, w.whole, dim, depth + 1)
    if inner is None:
        return None
    return dataclasses.replace(inner, whole=ev.slice_term(inner.whole, w.dim, w.start, w.stop))


def _window_form(ev: Evaluator, t: Term, depth: int) -> Window | None:
    if t.op == "slice":
        dim, start, stop = t.attrs
        return Window(t.args[0], dim, start, stop)
    if depth >= ev.budgets.window_depth:
        return None
    factor, base = ev.scale_of(t)
    if factor != 1:
        inner = window_form(ev, base, depth + 1)
        whole = ev.scaled(inner.whole, factor) if inner is not None else None
        return dataclasses.replace(inner, whole=whole) if inner is not None and whole is not None else None
    if t.op == "unary":
        inner = window_form(ev, t.args[0], depth + 1)
        if inner is None:
            return None
        return dataclasses.replace(
            inner, whole=ev.mk("unary", t.attrs, (inner.whole,), Shape(t.dtype, inner.whole.shape))
        )
    if t.op in ("bcast", "transpose"):
        inner = window_form(ev, t.args[0], depth + 1)
        if inner is None:
            return None
        if t.op == "bcast":
            out = BcastSpec.parse(t.attrs[0]).parts.index(("i", inner.dim))
        else:
            out = parse_transpose(t.attrs[0]).index(inner.dim)
        shape = list(t.shape)
        shape[out] = inner.whole.shape[inner.dim]
        whole = ev.mk(t.op, t.attrs, (inner.whole,), Shape(t.dtype, tuple(shape)))
        return Window(whole, out, inner.start, inner.stop)
    if t.op in ("binary", "ternary"):
        return _elementwise(ev, t, depth)
    if t.op == "dot":
        return _dot(ev, t, depth)
    if t.op == "reduce":
        return _reduce(ev, t, depth)
    if t.op == "aligned":
        return _aligned(ev, t, depth)
    if t.op == "reshape":
        return _unit_reshape(ev, t, depth)
    return None


def _unit_reshape(ev: Evaluator, t: Term, depth: int) -> Window | None:
    """A reshape that only adds or drops size-1 dims, of a window along a dim it keeps: the window
    of the same reshape of the whole (the dims of size > 1 keep their order, the window's among
    them): a squeezed row `logits[0]` of logits sharded over the vocabulary by jit."""
    x = t.args[0]
    kept_in = [d for d, n in enumerate(x.shape) if n != 1]
    kept_out = [d for d, n in enumerate(t.shape) if n != 1]
    if [x.shape[d] for d in kept_in] != [t.shape[d] for d in kept_out]:
        return None
    inner = next((w for d in kept_in if (w := window_along(ev, x, d, depth + 1)) is not None), None)
    if inner is None:
        return None
    out = kept_out[kept_in.index(inner.dim)]
    shape = list(t.shape)
    shape[out] = inner.whole.shape[inner.dim]
    return Window(ev.reshape_term(inner.whole, Shape(t.dtype, tuple(shape))), out, inner.start, inner.stop)


def _reduce(ev: Evaluator, t: Term, depth: int) -> Window | None:
    """A reduce over dims other than the window's: the window of the reduce of the whole (each kept
    lane is reduced on its own: softmax's max and sum over experts of a device's token groups)."""
    inner = window_form(ev, t.args[0], depth + 1) if len(t.args) == 1 and len(t.attrs) == 2 else None
    if inner is None:
        return None
    spec = ReduceSpec.parse(t.attrs[1])
    if inner.dim in spec.dims:
        return None
    out = inner.dim - sum(1 for k in spec.dims if k < inner.dim)
    shape = list(t.shape)
    shape[out] = inner.whole.shape[inner.dim]
    return Window(ev.mk("reduce", t.attrs, (inner.whole,), Shape(t.dtype, tuple(shape))), out, inner.start, inner.stop)


def _aligned(ev: Evaluator, t: Term, depth: int) -> Window | None:
    """An aligned map (a variadic reduce such as argmax, a sort's lanes, a batched gather) of
    operands windowed alike along dims aligned with one output dim (an operand constant along its
    dim widened, an argmax's iota), or of an rhs windowed along a dim no lhs dim is aligned with
    (rules/aligned.py: the same facts as rewrite rules)."""
    table = AlignedMap.parse(t.attrs[0])
    lhs, rhs = dict(table.lhs), dict(table.rhs)
    wx, wy = window_form(ev, t.args[0], depth + 1), window_form(ev, t.args[1], depth + 1)
    # the window of an operand that is no constant (a constant is widened, whatever it holds)
    found = [
        (own, side[own.dim])
        for own, side, operand in ((wy, rhs, t.args[1]), (wx, lhs, t.args[0]))
        if own is not None and own.dim in side and ev.folded(operand) is None
    ]
    if not found:
        return None
    w, o = found[0]
    wholes: list[Term | None] = []
    for operand, own, side in ((t.args[0], wx, lhs), (t.args[1], wy, rhs)):
        k = next((d for d, out in side.items() if out == o), None)
        if k is None:
            wholes.append(operand if side is lhs else None)  # read whole along o: an lhs only
        elif own is not None and (own.dim, own.start, own.stop) == (k, w.start, w.stop):
            wholes.append(own.whole)
        else:
            size = w.whole.shape[w.dim]
            wholes.append(widened(ev, operand, k, size) or _widened_constant(ev, operand, k, size))
    if any(x is None for x in wholes):
        return None
    shape = list(t.shape)
    shape[o] = w.whole.shape[w.dim]
    args = tuple(x for x in wholes if x is not None)
    return Window(ev.mk("aligned", t.attrs, args, Shape(t.dtype, tuple(shape))), o, w.start, w.stop)


def _widened_constant(ev: Evaluator, t: Term, dim: int, size: int) -> Term | None:
    """A constant the same at every index along `dim` (a top-k's iota over a device's rows), at
    `size` there."""
    value = ev.folded(t)
    if value is None or not value.size or not np.all(value == np.take(value, [0], axis=dim)):
        return None
    return ev.const(np.repeat(np.take(value, [0], axis=dim), size, axis=dim), t.dtype)


def _elementwise(ev: Evaluator, t: Term, depth: int) -> Window | None:
    """An elementwise op (binary, or ternary: a select, elu's `where(x > 0, x, expm1(x))`) of operands
    that are windows of one range along one dim, or constant along it: the window of the op on the
    wholes, each element computed from its own operands' elements."""
    found = [window_form(ev, a, depth + 1) for a in t.args]
    for w in found:
        if w is None:
            continue
        wholes: list[Term | None] = []
        for operand, own in zip(t.args, found):
            if own is not None and (own.dim, own.start, own.stop) == (w.dim, w.start, w.stop):
                wholes.append(own.whole)
            else:
                wholes.append(widened(ev, operand, w.dim, w.whole.shape[w.dim]))
        if all(x is not None and x.shape == w.whole.shape for x in wholes):
            terms = tuple(x for x in wholes if x is not None)
            return dataclasses.replace(w, whole=ev.mk(t.op, t.attrs, terms, Shape(t.dtype, w.whole.shape)))
    return None


def widened(ev: Evaluator, t: Term, dim: int, size: int) -> Term | None:
    """A broadcast along a new dim `dim` at `size` instead of its own (it is constant there)."""
    if t.op != "bcast":
        return None
    parts = list(BcastSpec.parse(t.attrs[0]).parts)
    if parts[dim][0] != "n":
        return None
    parts[dim] = ("n", size)
    shape = list(t.shape)
    shape[dim] = size
    return ev.mk("bcast", (BcastSpec(tuple(parts)).text(),), t.args, Shape(t.dtype, tuple(shape)))


def _dot(ev: Evaluator, t: Term, depth: int) -> Window | None:
    spec = DotSpec.parse(t.attrs[0])
    lhs_free = [k for k in range(spec.lhs_rank) if k not in spec.lhs_batch + spec.lhs_contract]
    rhs_free = [k for k in range(spec.rhs_rank) if k not in spec.rhs_batch + spec.rhs_contract]
    n_batch = len(spec.lhs_batch)
    for side, free, first in ((0, lhs_free, n_batch), (1, rhs_free, n_batch + len(lhs_free))):
        w = window_form(ev, t.args[side], depth + 1)
        if w is None or w.dim not in free:
            continue
        out = first + free.index(w.dim)
        args = list(t.args)
        args[side] = w.whole
        shape = list(t.shape)
        shape[out] = w.whole.shape[w.dim]
        return Window(ev.mk("dot", t.attrs, tuple(args), Shape(t.dtype, tuple(shape))), out, w.start, w.stop)
    return _dot_batch(ev, t, spec, depth)


def _dot_batch(ev: Evaluator, t: Term, spec: DotSpec, depth: int) -> Window | None:
    """A dot whose operands are windows of one range along a batch dim they share (or, one of them,
    constant along it): the window of the dot of the wholes along that output dim, each batch
    element a dot of its own (linear attention's `einsum("btf,bte->btfe", k, v)` of a device's tokens)."""
    found = [window_form(ev, a, depth + 1) for a in t.args]
    for side, w in enumerate(found):
        batch = (spec.lhs_batch, spec.rhs_batch)[side]
        if w is None or w.dim not in batch:
            continue
        out = batch.index(w.dim)
        wholes: list[Term | None] = []
        for operand, own, dims in zip(t.args, found, (spec.lhs_batch, spec.rhs_batch)):
            size = w.whole.shape[w.dim]
            if own is not None and (own.dim, own.start, own.stop) == (dims[out], w.start, w.stop):
                wholes.append(own.whole)
            else:
                wholes.append(widened(ev, operand, dims[out], size))
        if any(x is None for x in wholes):
            continue
        shape = list(t.shape)
        shape[out] = w.whole.shape[w.dim]
        whole = ev.mk("dot", t.attrs, tuple(x for x in wholes if x is not None), Shape(t.dtype, tuple(shape)))
        return Window(whole, out, w.start, w.stop)
    return None
