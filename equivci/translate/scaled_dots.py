"""A dot of a scaled operand as the scaled dot, for a scale along the dims the dot keeps.

dot(x, w * bcast(s)) = dot(x, w) * bcast'(s) when every dim of w the scale varies along is a free
or batch dim of the dot (a per-output-channel scale of a weight-only int8 linear layer: the
reference dequantizes the weight, `w.astype(f32) * scales[None, :]`, where a device applies its
slice of the scales to its dot's columns); bcast' lays s along the output dims those dims become.
The same for w / bcast(s) over floats (an integer quotient truncates each product before the
sum), and for the scale on either operand. Over the reals each output element
is sum_k x[.., k] * w[k, j] * s[j] = (sum_k x[.., k] * w[k, j]) * s[j]; a scale along a contracted
dim varies inside the sum and does not come out.

The dot's own term keeps its form (localization reads its operands); the scaled dot is stated
equal beside it, built as the program would build the unscaled dot (`handler`), so that it meets a
program that scales after the dot.
"""

from __future__ import annotations

from typing import Callable

from equivci.hlo.ir import FLOATS, Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.spec import BcastSpec, DotSpec
from equivci.translate.attributes import dims_attr
from equivci.translate.builder import Builder, Value
from equivci.translate.reductions import dot_term
from equivci.translate.shapes import broadcast_term

# The ops that apply a scale: the scale's place among their operands.
_SCALE_AT = {"multiply": (0, 1), "divide": (1,)}


def note(ev: Builder, inst: Instruction, args: list, result: Value, handler: Callable, device: int) -> None:
    """State result = the dot of the unscaled operand, scaled, for each operand scaled along kept dims."""
    if inst.opcode == "transpose" and isinstance(result, Term):
        transposed_scalar(ev, args[0], dims_attr(inst.attrs.get("dimensions")), result)
    if inst.opcode != "dot" or not isinstance(result, Term) or len(args) != 2:
        return
    out = inst.shape.dims
    for side, operand in enumerate(args):
        found = _scaled(operand)
        if found is None:
            continue
        op, base, scale = found
        dims = _output_dims(inst, side, len(operand.shape), BcastSpec.parse(scale.attrs[0]))
        if dims is None or scale.dtype != inst.shape.dtype or base.dtype != operand.dtype:
            continue
        if op == "divide" and inst.shape.dtype not in FLOATS:  # an integer quotient truncates inside the sum
            continue
        plain = list(args)
        plain[side] = base
        unscaled = handler(ev, inst, plain, device)
        if not isinstance(unscaled, Term):
            continue
        laid = broadcast_term(ev, scale.args[0], Shape(scale.dtype, out), dims)
        ev.equal_terms.append([result, ev.binary(op, unscaled, laid)])
        note(ev, inst, plain, unscaled, handler, device)  # w itself scaled again (per row and column)


def _scaled(t: Term) -> tuple[str, Term, Term] | None:
    """(op, w, bcast(s)) for t = w * bcast(s), bcast(s) * w or w / bcast(s)."""
    if t.op != "binary" or t.attrs[0] not in _SCALE_AT:
        return None
    for k in _SCALE_AT[t.attrs[0]]:
        scale, base = t.args[k], t.args[1 - k]
        if scale.op == "bcast" and base.op != "bcast" and base.shape == t.shape:
            return t.attrs[0], base, scale
    return None


def _output_dims(inst: Instruction, side: int, rank: int, spec: BcastSpec) -> tuple[int, ...] | None:
    """Where each dim of s lands in the dot's output (HLO order: batch dims, the lhs's free dims, the
    rhs's free dims); None when s varies along a contracted dim."""
    a = inst.attrs
    names = ("lhs", "rhs")
    batch = dims_attr(a.get(f"{names[side]}_batch_dims"))
    contract = dims_attr(a.get(f"{names[side]}_contracting_dims"))
    free = [d for d in range(rank) if d not in batch and d not in contract]
    first_free = len(inst.shape.dims) - len(free) if side == 1 else len(batch)
    place: dict[int, int] = {d: k for k, d in enumerate(batch)}
    place.update({d: first_free + k for k, d in enumerate(free)})
    pairs = sorted(spec.operand_dims(), key=lambda pair: pair[1])  # (operand dim of w, dim of s)
    if any(w_dim not in place for w_dim, _ in pairs):
        return None
    return tuple(place[w_dim] for w_dim, _ in pairs)


def transposed_scalar(ev: Builder, x: Term, perm: tuple[int, ...], result: Term) -> None:
    """State transpose(x) = transpose(y) op bcast(s) where x is y op bcast(s) or a dot of an operand
    scaled by bcast(s), s one number (rank 0) spread over every element: CLIP's `logits.T` of
    `(exp(t) * zi) @ zt.T`, where a device scales the other direction's scores, `(exp(t) * zt) @ zi.T`.
    Exact: every element is op of the same two numbers (a dot's sum of products each scaled by s
    is s times the sum over the reals, as for any scale along kept dims)."""
    found = _scaled(x) if x.op == "binary" else _scaled_dot_operand(ev, x)
    if found is None or found[2].args[0].shape != ():
        return
    op, base, scale = found
    shape = Shape(x.dtype, tuple(x.shape[k] for k in perm))
    laid = broadcast_term(ev, scale.args[0], shape, ())
    ev.equal_terms.append([result, ev.binary(op, ev.transpose_term(base, perm), laid)])


def _scaled_dot_operand(ev: Builder, x: Term) -> tuple[str, Term, Term] | None:
    """(op, dot of the unscaled operand, bcast(s)) for a dot one of whose operands is w * bcast(s) or
    w / bcast(s) (a float dot: an integer quotient truncates inside the sum)."""
    if x.op != "dot" or x.dtype not in FLOATS:
        return None
    for side, operand in enumerate(x.args):
        found = _scaled(operand)
        if found is None or found[2].args[0].shape != ():
            continue
        plain = list(x.args)
        plain[side] = found[1]
        spec = DotSpec.parse(x.attrs[0])
        return found[0], dot_term(ev, spec, plain[0], plain[1], Shape(x.dtype, x.shape)), found[2]
    return None
