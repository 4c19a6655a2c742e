"""An elementwise op on squeezed operands is the squeeze of the op on the unsqueezed ones.

A reshape that only drops size-1 dims (a squeeze) moves no element, so an elementwise op applied
after it is the same op applied before it, squeezed: tanh(squeeze(x) @ w + b) is the squeeze of
tanh(x @ w + b') with b' broadcast to x's shape (the size-1 dims as new dims of size 1). Values
taken one row at a time (`xs[t]` in a pipeline's or an accumulation's schedule: a one-row window,
squeezed) then keep that form through the arithmetic on them, where the reference computes on all
rows at once: the row's window of the reference value relates to the whole.

The op's own term keeps its form (localization reads its operands); the unsqueezed term is kept
beside it (`Builder.unsqueezed`), stated equal to it for the proof, and used where a layout is
followed: a reshape of the op is a reshape of the unsqueezed term, and a dot of it a relayout of
a dot (relayouts.py). Only floating-point arithmetic is lifted: index and mask arithmetic keep the
forms the mask and routing facts read."""

from __future__ import annotations

from equivci.hlo.ir import FLOATS, Shape
from equivci.terms.ir import Term, inserted_unit_dims
from equivci.terms.spec import BcastSpec
from equivci.translate.builder import Builder

ELEMENTWISE = ("unary", "binary", "ternary")


def unsqueezed(ev: Builder, term: Term) -> Term | None:
    """The term whose squeeze `term` is: a reshape's operand when it only drops size-1 dims, or
    what an elementwise op on squeezed operands was found to be the squeeze of."""
    if term.op == "reshape" and inserted_unit_dims(term.shape, term.args[0].shape) is not None:
        return term.args[0]
    return ev.unsqueezed.get(term)


def note(ev: Builder, term: Term) -> None:
    """Record an elementwise `term` as the squeeze of the op on the unsqueezed operands, when an
    operand is a squeeze and every other is a squeeze of the same shape, a broadcast or a constant
    (and the same for the op under a constant factor the builder put in front)."""
    _, base = ev.scale_of(term)
    if base is not term:
        note(ev, base)
    if term.op not in ELEMENTWISE or term.dtype not in FLOATS or term in ev.unsqueezed:
        return
    args = list(term.args)
    inner = next((x for a in args if (x := unsqueezed(ev, ev.scale_of(a)[1])) is not None), None)
    if inner is None or (units := inserted_unit_dims(term.shape, inner.shape)) is None:
        return
    widened = [_widened(ev, a, inner.shape, units) for a in args]
    if any(w is None for w in widened):
        return
    full = ev.normal(term.op, term.attrs, widened, Shape(term.dtype, inner.shape))
    ev.unsqueezed[term] = full
    ev.equal_terms.append([term, ev.reshape_term(full, Shape(term.dtype, term.shape))])


def _widened(ev: Builder, arg: Term, full: tuple[int, ...], units: set[int]) -> Term | None:
    """`arg` (of the squeezed shape) as a term of the full shape whose squeeze it is (a constant
    factor stays in front, as the builder keeps it)."""
    factor, base = ev.scale_of(arg)
    inner = unsqueezed(ev, base)
    if inner is not None:
        return ev.scaled(inner, factor) if inner.shape == full else None
    value = ev.folded(arg)
    if value is not None:
        return ev.const(value.reshape(full), arg.dtype)
    if arg.op != "bcast":
        return None
    parts = iter(BcastSpec.parse(arg.attrs[0]).parts)
    spec = BcastSpec(tuple(("n", 1) if p in units else next(parts) for p in range(len(full))))
    return ev.mk("bcast", (spec.text(),), [arg.args[0]], Shape(arg.dtype, full))
