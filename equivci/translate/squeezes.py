"""An elementwise op on squeezed operands is the squeeze of the op on the unsqueezed ones.

A reshape that only drops size-1 dims (a squeeze) moves no element, so an elementwise op applied
after it is the same op applied before it, squeezed: tanh(squeeze(x) @ w + b) is the squeeze of
tanh(x @ w + b') with b' broadcast to x's shape (the size-1 dims as new dims of size 1). Values
taken one row at a time (`xs[t]` in a pipeline's or an accumulation's schedule: a one-row window,
squeezed) then keep that form through the arithmetic on them, where the reference computes on all
rows at once; the row's window of the reference value relates to the whole, and a dot of the result
is a relayout of a dot (relayouts.py).

Only floating-point arithmetic is lifted: index and mask arithmetic keep the forms the mask and
routing facts read."""

from __future__ import annotations

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term, inserted_unit_dims
from equivci.terms.spec import BcastSpec
from equivci.translate.builder import Builder

FLOATS = {"bf16", "f16", "f32", "f64"}


def squeezed(term: Term) -> Term | None:
    """The operand of a reshape that only drops size-1 dims."""
    if term.op != "reshape" or inserted_unit_dims(term.shape, term.args[0].shape) is None:
        return None
    return term.args[0]


def lifted(ev: Builder, kind: str, attrs: tuple, args: list, shape: Shape) -> Term | None:
    """op(args) as squeeze(op(unsqueezed args)) when an operand is a squeeze and every other is a
    squeeze of the same shape, a broadcast or a constant; None otherwise."""
    if shape.dtype not in FLOATS or any(not isinstance(a, Term) for a in args):
        return None
    inner = next((x for a in args if (x := squeezed(ev.scale_of(a)[1])) is not None), None)
    if inner is None:
        return None
    full = inner.shape
    units = inserted_unit_dims(tuple(shape.dims), full)
    if units is None:
        return None
    widened = [_widened(ev, a, full, units) for a in args]
    if any(w is None for w in widened):
        return None
    op = ev.normal(kind, attrs, widened, Shape(shape.dtype, full))
    return ev.reshape_term(op, shape)


def _widened(ev: Builder, arg: Term, full: tuple[int, ...], units: set[int]) -> Term | None:
    """`arg` (of the squeezed shape) as a term of the full shape whose squeeze it is (a constant
    factor stays in front, as the builder keeps it)."""
    factor, base = ev.scale_of(arg)
    inner = squeezed(base)
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
