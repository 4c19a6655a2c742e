"""A dot with a size-1 batch pair is the dot without it.

dot_general pairs the batch dims of its operands index by index; a pair of size 1 has one index,
so the dot of x and y with such a pair is the dot of x and y with both dims squeezed away, its
output's size-1 batch dim inserted back: dot(x[:, None], y[None]; batch (1, 0)) =
dot(x, y)[None] in the output's batch place. So a device's dot of a squeezed operand (one KV
head, `w[:, g]` of a [d, G, hd] weight: the unit dim of its group dropped) with an operand of
several query heads is the squeeze of the dot of the unsqueezed operand and the other with a unit
dim inserted beside its heads, batched over the two: the grouped einsum the reference writes,
`bgqts` over G groups, at the device's group.

Stated where an operand is a squeeze (a reshape that only drops one size-1 dim, or a value known
as one: squeezes.py), for the unit dim inserted into the other operand before each of its free
dims (where the reference's group dim may lead them); the dot is built as the program would build
it (`handler`), the squeeze of its output stated equal to the written dot.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term, inserted_unit_dims
from equivci.terms.spec import DotSpec, parse_transpose, reshape_spec, swapped_dot
from equivci.translate.attributes import dims_attr
from equivci.translate.builder import Builder, Value
from equivci.translate.relayouts import reoriented
from equivci.translate.squeezes import unsqueezed


def note(ev: Builder, inst: Instruction, args: list, result: Value, handler: Callable, device: int) -> None:
    if inst.opcode != "dot" or not isinstance(result, Term) or len(args) != 2:
        return
    if any(not isinstance(a, Term) for a in args):
        return
    for side, operand in enumerate(args):
        full = unsqueezed(ev, operand)
        units = inserted_unit_dims(operand.shape, full.shape) if full is not None else None
        if full is None or units is None or len(units) != 1:
            continue
        other = args[1 - side]
        for batched, other_shape, beside in _batched(inst, side, units.pop(), other.shape):
            operands = list(args)
            operands[side] = full
            # a dot (the query heads' projection) in its one form, the transpose moved out of the
            # reshape that inserts the unit dim, where the reference splits its heads in groups
            oriented = reoriented(ev, other) or other
            operands[1 - side] = ev.reshape_term(oriented, Shape(other.dtype, other_shape))
            term = handler(ev, batched, operands, device)
            if not isinstance(term, Term):
                continue
            # and with its operands swapped: the reference's grouped dot may be written in the
            # other order (its batch pairs in the same order)
            for form in (term, _swapped(ev, term)):
                if form is None:
                    continue
                # the unit dim moved beside the heads it groups, as the reference's einsum lays
                # out its [.., G, M, ..] before merging them: a transpose of size-1 dims moves no
                # element, its squeeze is the device's dot
                moved = ev.transpose_term(form, beside)
                spec = (reshape_spec(moved.shape, inst.shape.dims),)
                ev.equal_terms.append([result, ev.mk("reshape", spec, [moved], inst.shape)])


def _swapped(ev: Builder, term: Term) -> Term | None:
    """A dot (under a transpose) as the transpose of the dot of its operands swapped."""
    perm, base = tuple(range(len(term.shape))), term
    if term.op == "transpose":
        perm, base = parse_transpose(term.attrs[0]), term.args[0]
    if base.op != "dot":
        return None
    spec, composed = swapped_dot(DotSpec.parse(base.attrs[0]), perm)
    shape = [0] * len(base.shape)
    for o, k in enumerate(swapped_dot(DotSpec.parse(base.attrs[0]), tuple(range(len(base.shape))))[1]):
        shape[k] = base.shape[o]
    out = Shape(base.dtype, tuple(shape))
    x, y = base.args
    inner = ev.factored("dot", (spec.text(),), [y, x], out) or ev.mk("dot", (spec.text(),), [y, x], out)
    return ev.transpose_term(inner, composed)


def _batched(inst: Instruction, side: int, unit: int, other: tuple[int, ...]):
    """The dots with the pair (unit of the squeezed side, p of the other) added as a batch pair,
    for p each place before one of the other operand's free dims of several entries (its heads): (instruction, the other
    operand's shape with its unit dim, the permutation of the output that moves the unit dim before
    the output dim of the other's dim at p). The pair goes where the lhs's batch dims stay in
    order (any place computes the same; this one is the order einsum writes)."""
    a = inst.attrs
    keys = (("lhs_batch_dims", "lhs_contracting_dims"), ("rhs_batch_dims", "rhs_contracting_dims"))
    batch = [list(dims_attr(a.get(k))) for k, _ in keys]
    contract = [list(dims_attr(a.get(k))) for _, k in keys]

    def shift(dims: list[int], at: int) -> list[int]:
        return [d + 1 if d >= at else d for d in dims]

    other_free = [d for d in range(len(other)) if d not in batch[1 - side] + contract[1 - side]]
    for p in (d for d in other_free if other[d] > 1):  # a group of several heads
        dims: list[list[list[int]]] = [[], []]
        dims[side] = [shift(batch[side], unit), shift(contract[side], unit)]
        dims[1 - side] = [shift(batch[1 - side], p), shift(contract[1 - side], p)]
        (lb, lc), (rb, rc) = dims
        new_l, new_r = (unit, p) if side == 0 else (p, unit)
        at = sum(1 for d in lb if d < new_l)
        lb.insert(at, new_l)
        rb.insert(at, new_r)
        attrs = dict(a)
        for key, value in zip(
            ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims"), (lb, rb, lc, rc)
        ):
            attrs[key] = "{" + ",".join(map(str, value)) + "}"
        out = list(inst.shape.dims)
        out.insert(at, 1)
        batched = dataclasses.replace(inst, attrs=attrs, shape=Shape(inst.shape.dtype, tuple(out)))
        # the output dim of the other's dim at p: after the batch dims (and the lhs's free dims)
        own_free = len(out) - len(lb) - len(other_free)
        heads = len(lb) + other_free.index(p) + (own_free if side == 0 else 0)
        rest = [o for o in range(len(out)) if o != at]
        place = rest.index(heads)
        beside = tuple(rest[:place] + [at] + rest[place:])
        yield batched, other[:p] + (1,) + other[p:], beside
