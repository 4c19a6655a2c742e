"""A dot of a quotient whose divisor is constant along the contraction, stated equal to the quotient
of the dot: dot(a / bcast(z), y) = dot(a, y) / bcast(z) when bcast(z) repeats z along every
contracted dim (a division by z distributes over the contracted sum). Softmax weights normalised
before the dot (the reference's `softmax(s) @ v`) then meet a program that divides after it (flash
decoding: the psum-ed numerator over the psum-ed denominator), whichever of the two writes which.
"""

from __future__ import annotations

from equivci.hlo.ir import FLOATS, Instruction, Shape
from equivci.terms.ir import Term, bcast_form
from equivci.terms.spec import BcastSpec, DotSpec, swapped_dot
from equivci.translate import reductions
from equivci.translate.attributes import dims_attr
from equivci.translate.builder import Builder
from equivci.translate.shapes import broadcast_term


def dot(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    """The dot as reductions.dot builds it; where an operand is such a quotient, the quotient of the
    dot is stated equal beside it (the written form stays the term: both programs keep it)."""
    term = reductions.dot(ev, inst, args, device)
    # (an integer quotient truncates: (a / z) summed is not the sum divided)
    if inst.shape.dtype not in FLOATS or any(not isinstance(x, Term) or x.dtype != inst.shape.dtype for x in args):
        return term
    a = inst.attrs
    spec = DotSpec(
        dims_attr(a.get("lhs_batch_dims")),
        dims_attr(a.get("rhs_batch_dims")),
        dims_attr(a.get("lhs_contracting_dims")),
        dims_attr(a.get("rhs_contracting_dims")),
        len(args[0].shape),
        len(args[1].shape),
        (args[0].dtype, args[1].dtype),
    )
    swapped, back = swapped_dot(spec, tuple(range(len(inst.shape.dims))))
    swapped_shape = [0] * len(back)
    for o, k in enumerate(back):
        swapped_shape[k] = inst.shape.dims[o]
    for side in (0, 1):
        found = _divisor_out_dims(spec, args[side], side)
        if found is None:
            continue
        numerator, divisor, out_dims = found
        operands = list(args)
        operands[side] = numerator
        spread = broadcast_term(ev, divisor, inst.shape, out_dims)
        quotient = ev.normal("binary", ("divide",), [reductions.dot(ev, inst, operands, device), spread], inst.shape)
        ev.equal_terms.append([term, quotient])
        # The same fact of the dot with its operands swapped, the form the loader also knows a
        # transposed dot by (attention's context written dot(v, probs) then transposed, against
        # dot(probs, v)): its quotient meets the other program's there.
        shape = Shape(inst.shape.dtype, tuple(swapped_shape))
        dims = tuple(back[o] for o in out_dims)
        ev.equal_terms.append(
            [
                ev.normal("dot", (swapped.text(),), [args[1], args[0]], shape),
                ev.normal(
                    "binary",
                    ("divide",),
                    [
                        ev.normal("dot", (swapped.text(),), [operands[1], operands[0]], shape),
                        broadcast_term(ev, divisor, shape, dims),
                    ],
                    shape,
                ),
            ]
        )
    return term


def output_dims(spec: DotSpec, side: int) -> dict[int, int]:
    """The dot's output dim of each batch and free dim of operand `side` (HLO order: batch dims, then
    the lhs's free dims, then the rhs's)."""
    batch, contract, rank = (
        (spec.lhs_batch, spec.lhs_contract, spec.lhs_rank)
        if side == 0
        else (spec.rhs_batch, spec.rhs_contract, spec.rhs_rank)
    )
    own_free = [k for k in range(rank) if k not in batch and k not in contract]
    start = len(batch) + (spec.lhs_rank - len(spec.lhs_batch) - len(spec.lhs_contract) if side == 1 else 0)
    return {**{k: n for n, k in enumerate(batch)}, **{k: start + n for n, k in enumerate(own_free)}}


def _divisor_out_dims(spec: DotSpec, operand: Term, side: int) -> tuple[Term, Term, tuple[int, ...]] | None:
    """(a, z, the dot's output dim of each dim of z) when `operand` is a / bcast(z) with bcast
    repeating z along every contracted dim of the operand."""
    if operand.op != "binary" or operand.attrs != ("divide",):
        return None
    numerator, denominator = operand.args
    form = bcast_form(denominator)
    if form is None:
        return None
    bcast, divisor = form
    out_of = output_dims(spec, side)
    pairs = BcastSpec.parse(bcast).operand_dims()  # (operand dim of the dot, dim of z)
    if any(k not in out_of for k, _ in pairs):  # z varies along a contracted dim
        return None
    by_divisor_dim = {i: out_of[k] for k, i in pairs}
    return numerator, divisor, tuple(by_divisor_dim[i] for i in range(len(divisor.shape)))


HANDLERS = {"dot": dot}
