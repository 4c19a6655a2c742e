"""The power of two of a factor moved out of roundings to another float dtype.

    convert(f · x) = p · convert((f / p) · x)     p the power of two in f (builder.power_of_two)

Scaling by a power of two moves only the exponent, so a rounding to a float dtype commutes with
it: the identity is exact in floats (not only over the reals) while neither side leaves the
dtype's exponent range, and the f32 product f · x is p times the f32 product (f / p) · x. A loss-
scaled step differentiates `s · L` and undoes the scale after the all-reduce; its cotangent,
rounded to bf16 for the bf16 matmuls and back, is s / rows-per-device on a data shard and s / rows
in the reference, one power of two apart whatever s is. Only the power of two: rounding 3 · x is
not 3 times the rounding of x, and a factor that is no constant (a bf16 norm weight applied after
the cast instead of before it) keeps its rounding where it is: such programs stay unproven.

The power of two goes in front of the outermost convert of a chain of float converts (f32 -> bf16
-> f32) whose dtype takes a factor (builder.SCALABLE: the narrow bf16 value in the middle stays as
written); an all-reduce of values each rounded to a narrower float is its sum rounded once
(collectives._rounded_sum, Builder.rounded_sums), and the factor is found inside that form too.
"""

from __future__ import annotations

from fractions import Fraction

from equivci.hlo.ir import FLOATS, Shape
from equivci.terms.ir import Term
from equivci.translate.builder import SCALABLE, Builder, power_of_two


def scaled_out(ev: Builder, term: Term) -> Term | None:
    """p · (the converts of `term` applied to (f / p) · x) where `term` is a chain of float converts
    of f · x, p the power of two in f, p != 1, and its dtype takes a factor; None otherwise."""
    if term.dtype not in SCALABLE:
        return None
    chain: list[Term] = []
    t = term
    factor, base = Fraction(1), t
    while _is_rounding(t):
        chain.append(t)
        t = ev.rounded_sums.get(t.args[0], t.args[0])
        factor, base = ev.scale_of(t)
        if factor != 1:
            break
    if factor == 0 or (front := power_of_two(factor)) == 1:
        return None
    inner = ev.scaled(base, factor / front)
    if inner is None:
        return None
    for c in reversed(chain):
        inner = ev.mk("unary", c.attrs, [inner], Shape(c.dtype, c.shape))
    return ev.scaled(inner, front)


def _is_rounding(t: Term) -> bool:
    return t.op == "unary" and t.attrs == ("convert",) and t.dtype in FLOATS and t.args[0].dtype in FLOATS
