"""A sum over devices of one linear map of each device's value is the map of their sum.

    sum_d f(x_d) = f(sum_d x_d)      f linear in x, its other operands the same on every device

A device that holds a partial sum (its shard of a contraction) often carries it on through more
ops before the all-reduce: an expert layer's hidden dim split over `tp` computes its down
projection's partial sum, scales it per expert, masks it by the routing, sums over the experts,
puts its rows back in token order and combines the top-k choices, and only then psums. Each of
those ops is linear in the partial sum with its other operands (the scale, the mask, the indices,
the combine weights) the same on every device of the group. The fact is stated, not rewritten:
the all-reduce's sum in group order is stated equal to f applied to the sum of the innermost
values, which the rules merge into the reference's contraction (dots/contraction_merge).

Linear in the one operand that differs between the devices (over the reals; integers wrap alike):
a layout op (reshape, transpose, slice, broadcast), an add-reduce, a product by a shared factor, a
quotient of it by a shared divisor, a dot with a shared operand, a gather at shared indices, and
a select of it against a shared zero. Not an add of a shared term or a concatenation with one:
the shared part would be counted once per device.
"""

from __future__ import annotations

from collections.abc import Callable

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.spec import AlignedMap
from equivci.translate.builder import Builder

LAYOUT = ("reshape", "transpose", "slice", "bcast")


def linear_sums(ev: Builder, members: list[Term], add: Callable[[list[Term]], Term]) -> list[Term]:
    """f(add(inner values)) when every member is f of its own value (module docstring), else none.
    `add` sums the innermost values (the collective's own combine, which knows their forms). Also
    cut where the values summed are add-reductions, g(sum_d reduce(y_d)) for f = g . reduce: the
    reductions of the devices' windows merge as the reference's one (the rules merge reductions
    of adjacent windows), where the sum of the windows themselves, elementwise, is no window of it
    (a temperature's gradient, each device's reduce over its rows times the shared temperature)."""
    chain: list[tuple[Term, int]] = []
    levels = [members]
    while (pos := _varying_operand(ev, levels[-1])) is not None:
        chain.append((levels[-1][0], pos))
        levels.append([m.args[pos] for m in levels[-1]])
    cuts = [len(chain)] if chain else []
    cuts += [k for k in range(1, len(chain)) if levels[k][0].op == "reduce"]
    return [_mapped(ev, chain[:k], add(levels[k])) for k in cuts]


def _mapped(ev: Builder, chain: list[tuple[Term, int]], acc: Term) -> Term:
    """The maps of `chain`, innermost last, applied to acc."""
    for template, pos in reversed(chain):
        args = list(template.args)
        args[pos] = acc
        acc = ev.normal(template.op, template.attrs, args, Shape(template.dtype, template.shape))
    return acc


def _varying_operand(ev: Builder, level: list[Term]) -> int | None:
    """The position of the one operand that differs between the members, when they are one op with
    the same attributes and other operands and the op is linear in that operand."""
    first = level[0]
    if any(m.op != first.op or m.attrs != first.attrs or len(m.args) != len(first.args) for m in level):
        return None
    varying = [k for k in range(len(first.args)) if any(m.args[k] is not first.args[k] for m in level)]
    if len(varying) != 1:
        return None
    pos = varying[0]
    return pos if _linear_in(ev, first, pos) else None


def _linear_in(ev: Builder, t: Term, pos: int) -> bool:
    if t.op in LAYOUT or t.op == "dot":
        return True
    if t.op == "reduce":
        return t.attrs[0] == "add" and len(t.args) == 1
    if t.op == "binary":
        return t.attrs[0] == "multiply" or (t.attrs[0] == "divide" and pos == 0)
    if t.op == "aligned":
        return AlignedMap.op_key(t.attrs[0]).startswith("gather:") and pos == 0
    if t.op == "ternary" and t.attrs[0] == "select" and pos in (1, 2):
        return ev.uniform(t.args[3 - pos]) == 0
    return False
