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

from collections.abc import Callable

from equivci.hlo.ir import FLOATS, Shape
from equivci.terms.ir import Term, bcast_form, inserted_unit_dims
from equivci.terms.spec import BcastSpec, DotSpec
from equivci.translate.builder import Builder

ELEMENTWISE = ("unary", "binary", "ternary")
Normal = Callable[[DotSpec, Term, Term, Shape], Term]  # a dot in the builder's normal form


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


def _one_unit(ev: Builder, t: Term) -> tuple[Term, tuple[int, ...], int] | None:
    """(u, at, k) when `t` is the squeeze of u that drops exactly one size-1 dim, k: t's dim d is
    u's dim at[d]."""
    inner = unsqueezed(ev, t)
    units = None if inner is None else inserted_unit_dims(t.shape, inner.shape)
    if inner is None or units is None or len(units) != 1 or inner.dtype != t.dtype:
        return None
    (k,) = units
    return inner, tuple(d for d in range(len(inner.shape)) if d != k), k


def squeezed_dot(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, term: Term, normal: Normal) -> None:
    """State a dot of squeezed operands as the squeeze of the dot of the unsqueezed ones, and record
    it (`Builder.unsqueezed`): the dropped size-1 dim of each operand a free dim, or, when both
    operands dropped one, the pair a batch pair (first). A size-1 dim holds no data, so as a free
    dim or as a batch pair of two it only inserts size-1 dims into the output:

        dot(squeeze(x), y) = squeeze(dot(x, y)),  dot(squeeze(x), squeeze(y)) = squeeze(dot_batched(x, y))

    A rank holding one expert writes `silu(x @ w1[0]) @ w2[0]`; the reference's vmap over experts
    computes `dot(x, w1)` with the expert a free dim, then a dot batched over experts: the
    unsqueezed dots are their windows at the rank's expert."""
    left, right = _one_unit(ev, lhs), _one_unit(ev, rhs)
    if (left is None and right is None) or term in ev.unsqueezed or term.op != "dot":
        return
    x, at_x, ux = left or (lhs, tuple(range(len(lhs.shape))), None)
    y, at_y, uy = right or (rhs, tuple(range(len(rhs.shape))), None)
    unit_x, unit_y = ((ux,), (uy,)) if ux is not None and uy is not None else ((), ())
    new = DotSpec(
        unit_x + tuple(at_x[d] for d in spec.lhs_batch),
        unit_y + tuple(at_y[d] for d in spec.rhs_batch),
        tuple(at_x[d] for d in spec.lhs_contract),
        tuple(at_y[d] for d in spec.rhs_contract),
        len(x.shape),
        len(y.shape),
        spec.dtypes,
    )
    dims = [x.shape[d] for d in new.lhs_batch]
    for operand, batch, contract in ((x, new.lhs_batch, new.lhs_contract), (y, new.rhs_batch, new.rhs_contract)):
        dims += [size for d, size in enumerate(operand.shape) if d not in batch + contract]
    full = normal(new, x, y, Shape(term.dtype, tuple(dims)))
    ev.unsqueezed[term] = full
    ev.equal_terms.append([term, ev.reshape_term(full, Shape(term.dtype, term.shape))])


def product_as_dot(ev: Builder, term: Term, normal: Normal) -> None:
    """State a product of two squeezed values, one broadcast along the other's dims, as the dot of
    the unsqueezed values over their dropped size-1 dims (the other dims a batch pair where both
    have them):

        bcast(squeeze(a)) * squeeze(y) = dot(y, a; contract the size-1 dims, batch a's dims)

    (a sum over one index is its one term). A rank holding one expert weights its expert's output
    by its column of the combine weights, `combine[..., e][..., None] * expert(x)`, psums it over
    the experts' ranks: each product is the piece at e of the reference's contraction
    `einsum("ebtd,bte->btd", every, combine)`."""
    if term.op != "binary" or term.attrs[0] != "multiply" or term.dtype not in FLOATS:
        return
    for wide, value in (term.args, term.args[::-1]):
        found = bcast_form(wide)
        spec, a = (
            found if found is not None else (BcastSpec(tuple(("i", k) for k in range(len(wide.shape)))).text(), wide)
        )
        narrow, other = _one_unit(ev, a), _one_unit(ev, value)
        if narrow is None or other is None:
            continue
        (a_u, at_a, ua), (y_u, at_y, uy) = narrow, other
        mapped = sorted(BcastSpec.parse(spec).operand_dims())  # (term dim, a's dim)
        dot = DotSpec(
            tuple(at_y[o] for o, _ in mapped),
            tuple(at_a[k] for _, k in mapped),
            (uy,),
            (ua,),
            len(y_u.shape),
            len(a_u.shape),
            (y_u.dtype, a_u.dtype),
        )
        order = [o for o, _ in mapped] + [o for o in range(len(term.shape)) if o not in dict(mapped)]
        inner = Shape(term.dtype, tuple(term.shape[o] for o in order))
        product = ev.transpose_term(normal(dot, y_u, a_u, inner), tuple(order.index(o) for o in range(len(order))))
        ev.equal_terms.append([term, product])
        return
