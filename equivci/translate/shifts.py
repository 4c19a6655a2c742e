"""Exponentials shifted by a running max, rescaled as the max grows (online softmax: ring attention,
blockwise attention), in one form: the sums of exponentials rescaled to the newest shift.

The facts, each an identity over the reals:
* rescaling: exp(s - a) * exp(a - b) = exp(s - b), and a factor constant along a sum's reduced
  (or a dot's contracted) dims moves into each summand: reduce(exp(s - a)) * exp(a - b) =
  reduce(exp(s - b)), dot(exp(s - a), v) * exp(a - b) = dot(exp(s - b), v); a product distributes
  over a sum and 0 * x = 0 (the accumulator's first rescale, of zeros, by exp(-inf - m));
* finite sums and maxima do not depend on the order of their terms: a sum of exponentials that share
  one shift, and a max of reduce-maxima, are built with their terms in one order (by the windows of
  the inputs they read), so that a ring's blocks, arriving in rotated order, sit beside their
  neighbours and their windows merge (terms/rules: reductions/merge_*, dots/contraction_merge).

A shift that differs between terms (an accumulator not rescaled while its denominator is) keeps
them apart: nothing here applies, and the ratio is not the reference's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term, bcast_form
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import BcastSpec, DotSpec, ReduceSpec
from equivci.translate.builder import Builder
from equivci.translate.quotients import output_dims
from equivci.translate.shapes import broadcast_term

KEY_NODES = 256  # the nodes a term's window key reads: enough for the blocks of an attention step


def rescaled_product(ev: Builder, x: Term, y: Term) -> Term | None:
    """x * y in the rescaled form, when one operand is exp(a - b) (broadcast) and the other a sum of
    exponentials shifted by that a, each with a's dims where the factor has them."""
    for acc, factor in ((x, y), (y, x)):
        form = bcast_form(factor)
        spec, e = form if form is not None else (None, factor)
        if e.op != "unary" or e.attrs != ("exponential",) or e.args[0].op != "binary":
            continue
        if e.args[0].attrs != ("subtract",) or acc.shape != factor.shape or acc.dtype != factor.dtype:
            continue
        old, new = e.args[0].args
        dims = _operand_dims(spec, len(old.shape))
        if (moved := _rescaled(ev, acc, old, new, dims)) is not None:
            return moved
    return None


def sorted_sum(ev: Builder, x: Term, y: Term) -> Term | None:
    """x + y with the terms of both in window order, when every term is an exponential (or a sum
    or dot of one) shifted by one and the same value."""
    shifts = set()
    for t in _shallowest_first((x, y), "add"):
        piece = _shifted_piece(t)
        if piece is None:
            return None
        shifts.add(id(piece[1]))
        if len(shifts) > 1:
            return None
    return _in_order(ev, "add", _leaves(x, "add") + _leaves(y, "add"))


def sorted_max(ev: Builder, x: Term, y: Term) -> Term | None:
    """max(x, y) with the terms of both in window order, when every term is a reduce-max (a running
    max over blocks)."""
    if any(t.op != "reduce" or t.attrs[0] != "maximum" for t in _shallowest_first((x, y), "maximum")):
        return None
    return _in_order(ev, "maximum", _leaves(x, "maximum") + _leaves(y, "maximum"))


def _operand_dims(spec: str | None, rank: int) -> tuple[int, ...]:
    """The dim of the broadcast of each of its operand's dims (every dim its own without one)."""
    if spec is None:
        return tuple(range(rank))
    by_operand = {i: o for o, i in BcastSpec.parse(spec).operand_dims()}
    return tuple(by_operand[i] for i in range(rank))


def _shift(t: Term) -> tuple[Term, Term, tuple[int, ...], str | None] | None:
    """(s, a, t's dim of each dim of a, the broadcast's spec) when t = exp(s - bcast(a))."""
    if t.op != "unary" or t.attrs != ("exponential",):
        return None
    d = t.args[0]
    if d.op != "binary" or d.attrs != ("subtract",):
        return None
    s, sub = d.args
    form = bcast_form(sub)
    spec, a = form if form is not None else (None, sub)
    return s, a, _operand_dims(spec, len(a.shape)), spec


def _shifted_piece(t: Term) -> tuple[Term, Term] | None:
    """(the exponential, its shift) of a shifted exponential, a sum of one or a dot with one."""
    if t.op == "reduce" and t.attrs[0] == "add":
        t = t.args[0]
    elif t.op == "dot":
        t = next((a for a in t.args if _shift(a) is not None), t)
    found = _shift(t)
    return (t, found[1]) if found is not None else None


def _rescaled(ev: Builder, acc: Term, old: Term, new: Term, dims: tuple[int, ...]) -> Term | None:
    """acc * bcast(exp(old - new)) (old's dim i at acc's dim dims[i]) with every exponential of acc
    shifted by `new` instead of `old`; None where a term of acc is no such exponential."""
    shape = Shape(acc.dtype, acc.shape)
    if ev.uniform(acc) == 0:
        return acc
    factor, base = ev.scale_of(acc)
    if factor == 0:
        return ev.const(np.zeros(acc.shape, NP_DTYPES[acc.dtype]), acc.dtype)
    if factor != 1:
        inner = _rescaled(ev, base, old, new, dims)
        return ev.scaled(inner, factor) if inner is not None else None
    if acc.op == "binary" and acc.attrs == ("add",):
        parts = [_rescaled(ev, part, old, new, dims) for part in acc.args]
        if parts[0] is None or parts[1] is None:
            return None
        return ev.normal("binary", ("add",), parts, shape)
    if acc.op == "reduce" and acc.attrs[0] == "add":
        reduced = ReduceSpec.parse(acc.attrs[1]).dims
        kept = [k for k in range(len(acc.args[0].shape)) if k not in reduced]
        inner = _exp_rescaled(ev, acc.args[0], old, new, {k: n for n, k in enumerate(kept)}, dims)
        return ev.normal("reduce", acc.attrs, [inner], shape) if inner is not None else None
    if acc.op == "dot":
        spec = DotSpec.parse(acc.attrs[0])
        for side in (0, 1):
            inner = _exp_rescaled(ev, acc.args[side], old, new, output_dims(spec, side), dims)
            if inner is not None:
                operands = list(acc.args)
                operands[side] = inner
                return ev.normal("dot", acc.attrs, operands, shape)
        return None
    return _exp_rescaled(ev, acc, old, new, {k: k for k in range(len(acc.shape))}, dims)


def _exp_rescaled(
    ev: Builder, p: Term, old: Term, new: Term, out_of: dict[int, int], dims: tuple[int, ...]
) -> Term | None:
    """exp(s - bcast(new)) for p = exp(s - bcast(old)), when each dim of old is at a dim of p that
    `out_of` (p's dim -> the accumulator's dim; reduced or contracted dims absent) takes to the
    factor's dim of it: the factor is then constant along every dim the accumulator sums over."""
    found = _shift(p)
    if found is None:
        return None
    s, a, at, _ = found
    if a is not old or new.shape != old.shape or tuple(out_of.get(k) for k in at) != dims:
        return None
    moved = broadcast_term(ev, new, Shape(new.dtype, p.shape), at)
    exponent = ev.normal("binary", ("subtract",), [s, moved], Shape(p.dtype, p.shape))
    return ev.normal("unary", ("exponential",), [exponent], Shape(p.dtype, p.shape))


def _leaves(t: Term, op: str) -> list[Term]:
    if t.op == "binary" and t.attrs == (op,):
        return _leaves(t.args[0], op) + _leaves(t.args[1], op)
    return [t]


def _shallowest_first(roots: tuple[Term, ...], op: str) -> Iterator[Term]:
    """The leaves of the `op` trees under roots, the shallowest first: a leaf that is no term of a
    sorted sum or max ends the check before the walk descends a long chain (the residual stream, a
    sum of every earlier layer's outputs: walked whole at every layer, quadratic in the depth)."""
    queue = deque(roots)
    while queue:
        t = queue.popleft()
        if t.op == "binary" and t.attrs == (op,):
            queue.extend(t.args)
        else:
            yield t


def _in_order(ev: Builder, op: str, terms: list[Term]) -> Term:
    ordered = sorted(terms, key=_window_key)
    acc = ordered[0]
    for t in ordered[1:]:
        acc = ev.normal("binary", (op,), [acc, t], Shape(acc.dtype, acc.shape))
    return acc


def _window_key(t: Term) -> tuple:
    """The windows (slices) a term reads, in the order a walk of it meets them: terms that differ
    only in which block of an input they read sort by the block's place."""
    found: list[tuple] = []
    seen: set[int] = set()
    stack = [t]
    while stack and len(seen) < KEY_NODES:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if u.op == "slice":
            found.append(u.attrs)
        stack.extend(reversed(u.args))
    return tuple(found)
