"""Complex values as pairs of real ones: z = re + i·im is the term complex(re, im), and every op on
complex values that this module knows is done on the parts, so that a reference written with
complex numbers (RoPE as z · e^{iθ}) meets code written with cos/sin on real pairs.

* complex(a, b), a complex literal, and a real value converted to complex are pairs; real and imag
  of a pair are its parts;
* add, subtract, negate act on each part; a bilinear op f (multiply, dot) of two pairs is
  f(a + bi, c + di) = (f(a, c) − f(b, d)) + i·(f(a, d) + f(b, c));
* ops that only move elements (reshape, broadcast, transpose, slices, concatenation, select, pad,
  gather) move both parts alike.

Any other op with a complex operand or result, or with a complex operand that is not a pair, is
opaque: nothing is claimed of it (the rules are identities over the reals).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.translate.builder import Builder, Value
from equivci.translate.literals import parse_literal
from equivci.translate.opaque import opaque

PART = {"c64": "f32", "c128": "f64"}  # the real dtype of each complex one's parts
MOVES = {
    "reshape",
    "bitcast",
    "broadcast",
    "transpose",
    "slice",
    "dynamic-slice",
    "dynamic-update-slice",
    "concatenate",
    "copy",
    "select",
    "pad",
    "gather",
}
# Ops that hand on values without computing (their own handlers keep pairs whole).
STRUCTURAL = {"tuple", "get-tuple-element", "opt-barrier", "custom-call"}
BILINEAR = {"multiply", "dot"}
LINEAR = {"add", "subtract", "negate"}

Handler = Callable[[Builder, Instruction, list, int], Value]


def pair(ev: Builder, re: Term, im: Term, dtype: str) -> Term:
    return ev.mk("binary", ("complex",), (re, im), Shape(dtype, re.shape))


def parts(z) -> tuple[Term, Term] | None:
    """(re, im) of a pair, else None."""
    if isinstance(z, Term) and z.op == "binary" and z.attrs == ("complex",):
        return z.args[0], z.args[1]
    return None


def evaluate(ev: Builder, inst: Instruction, args: list, device: int, handlers: dict[str, Handler]) -> Value | None:
    """The value of an op on or to complex values, from ops on their parts (opaque when this module
    does not know it); None for an op without complex operands or result."""
    op = inst.opcode
    complex_args = [isinstance(a, Term) and a.dtype in PART for a in args]
    out = None if inst.shape.is_tuple else inst.shape.dtype
    if (not any(complex_args) and out not in PART) or op in STRUCTURAL:
        return None
    if op == "complex" and out in PART:
        return pair(ev, args[0], args[1], out)
    if op == "constant" and out in PART:
        value = parse_literal(inst.attrs["_literal"], Shape(PART[out], (*inst.shape.dims, 2)), ev.budgets.fold_elements)
        if value is None:
            return opaque(ev, inst, args)
        return pair(ev, ev.const(np.array(value[..., 0]), PART[out]), ev.const(np.array(value[..., 1]), PART[out]), out)
    if op == "convert" and out in PART and not any(complex_args):
        part = handlers["convert"](ev, _as(inst, PART[out]), args, device)
        if isinstance(part, Term):
            return pair(ev, part, ev.const(np.zeros(inst.shape.dims, dtype=NP_DTYPES[PART[out]]), PART[out]), out)
        return opaque(ev, inst, args)
    split = [parts(a) if c else None for a, c in zip(args, complex_args)]
    if any(c and s is None for c, s in zip(complex_args, split)):
        return opaque(ev, inst, args)
    if op in ("real", "imag") and split[0] is not None:
        return split[0][0 if op == "real" else 1]
    handler = handlers.get(op)
    if out not in PART or handler is None:
        return opaque(ev, inst, args)
    real = _as(inst, PART[out])
    left, right = (split[0], split[1]) if len(split) == 2 else (None, None)
    if op in BILINEAR and left is not None and right is not None:
        (a, b), (c, d) = left, right

        def f(x: Term, y: Term) -> Term | None:
            """The op on two parts; None where it is zero (a real value's imaginary part)."""
            if ev.uniform(x) == 0 or ev.uniform(y) == 0:
                return None
            if op == "multiply" and (ev.uniform(x) == 1 or ev.uniform(y) == 1):
                return y if ev.uniform(x) == 1 else x
            return handler(ev, real, [x, y], device)  # type: ignore[return-value]  # one array

        re = _sum(ev, real, device, handlers, [(1, f(a, c)), (-1, f(b, d))])
        im = _sum(ev, real, device, handlers, [(1, f(a, d)), (1, f(b, c))])
    elif op in LINEAR and all(complex_args):
        signs = {"add": (1, 1), "subtract": (1, -1), "negate": (-1,)}[op]
        re, im = (_sum(ev, real, device, handlers, [(g, s[k]) for g, s in zip(signs, split) if s]) for k in (0, 1))
    elif op in MOVES:
        re, im = (
            handler(ev, real, [s[k] if s is not None else a for a, s in zip(args, split)], device) for k in (0, 1)
        )
    else:
        return opaque(ev, inst, args)
    if not (isinstance(re, Term) and isinstance(im, Term)):
        return opaque(ev, inst, args)
    return pair(ev, re, im, out)


def _sum(
    ev: Builder, real: Instruction, device: int, handlers: dict[str, Handler], terms: list[tuple[int, Term | None]]
) -> Value:
    """Σ sign · term over the terms that are not zero (None or a constant 0), with the elementwise
    handlers (folded, in normal form); a zero array when none is left."""
    kept = [(sign, t) for sign, t in terms if t is not None and ev.uniform(t) != 0]
    if not kept:
        return ev.const(np.zeros(real.shape.dims, dtype=NP_DTYPES[real.shape.dtype]), real.shape.dtype)
    sign, first = kept[0]
    total: Value = first
    if sign < 0:
        total = handlers["negate"](ev, dataclasses.replace(real, opcode="negate"), [total], device)
    for sign, t in kept[1:]:
        op = "add" if sign > 0 else "subtract"
        total = handlers[op](ev, dataclasses.replace(real, opcode=op), [total, t], device)
    return total


def _as(inst: Instruction, dtype: str) -> Instruction:
    """The instruction with a result of `dtype` (the same dims): the op on one part."""
    return dataclasses.replace(inst, shape=dataclasses.replace(inst.shape, dtype=dtype))
