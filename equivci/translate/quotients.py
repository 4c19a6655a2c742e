"""A dot of a quotient whose divisor is constant along the contraction, stated equal to the quotient
of the dot: dot(a / bcast(z), y) = dot(a, y) / bcast(z) when bcast(z) repeats z along every
contracted dim (a division by z distributes over the contracted sum). Softmax weights normalised
before the dot (the reference's `softmax(s) @ v`) then meet a program that divides after it (flash
decoding: the psum-ed numerator over the psum-ed denominator), whichever of the two writes which.
"""

from __future__ import annotations

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term, bcast_form
from equivci.terms.spec import BcastSpec
from equivci.translate import reductions
from equivci.translate.attributes import dims_attr
from equivci.translate.builder import Builder
from equivci.translate.shapes import broadcast_term


def dot(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    """The dot as reductions.dot builds it; where an operand is such a quotient, the quotient of the
    dot is stated equal beside it (the written form stays the term: both programs keep it)."""
    term = reductions.dot(ev, inst, args, device)
    for side in (0, 1):
        found = _divisor_out_dims(inst, args, side)
        if found is None:
            continue
        numerator, divisor, out_dims = found
        operands = list(args)
        operands[side] = numerator
        spread = broadcast_term(ev, divisor, inst.shape, out_dims)
        quotient = ev.normal(
            "binary",
            ("divide",),
            [reductions.dot(ev, inst, operands, device), spread],
            Shape(inst.shape.dtype, inst.shape.dims),
        )
        ev.equal_terms.append([term, quotient])
    return term


def _divisor_out_dims(inst: Instruction, args: list, side: int) -> tuple[Term, Term, tuple[int, ...]] | None:
    """(a, z, the dot's output dim of each dim of z) when operand `side` is a / bcast(z) with bcast
    repeating z along every contracted dim of that operand, all in the dot's own dtype."""
    operand = args[side]
    if operand.op != "binary" or operand.attrs != ("divide",) or not isinstance(operand, Term):
        return None
    if any(not isinstance(x, Term) or x.dtype != inst.shape.dtype for x in args):
        return None
    numerator, denominator = operand.args
    form = bcast_form(denominator)
    if form is None:
        return None
    spec, divisor = form
    a = inst.attrs
    batch = dims_attr(a.get("lhs_batch_dims" if side == 0 else "rhs_batch_dims"))
    contract = set(dims_attr(a.get("lhs_contracting_dims" if side == 0 else "rhs_contracting_dims")))
    out_of = _output_dims(inst, args, side, batch, contract)
    pairs = BcastSpec.parse(spec).operand_dims()  # (operand dim of the dot, dim of z)
    if any(k in contract for k, _ in pairs):
        return None
    by_divisor_dim = dict((i, out_of[k]) for k, i in pairs)
    return numerator, divisor, tuple(by_divisor_dim[i] for i in range(len(divisor.shape)))


def _output_dims(
    inst: Instruction, args: list, side: int, batch: tuple[int, ...], contract: set[int]
) -> dict[int, int]:
    """The dot's output dim of each batch and free dim of operand `side` (HLO order: batch dims, then
    the lhs's free dims, then the rhs's)."""
    a = inst.attrs
    lhs_free = [
        k
        for k in range(len(args[0].shape))
        if k not in dims_attr(a.get("lhs_batch_dims")) and k not in dims_attr(a.get("lhs_contracting_dims"))
    ]
    own_free = [k for k in range(len(args[side].shape)) if k not in batch and k not in contract]
    start = len(batch) + (len(lhs_free) if side == 1 else 0)
    return {**{k: n for n, k in enumerate(batch)}, **{k: start + n for n, k in enumerate(own_free)}}


HANDLERS = {"dot": dot}
