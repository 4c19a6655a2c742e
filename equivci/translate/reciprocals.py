"""A product by a constant that is a number's reciprocal rounded to the dtype, as the quotient by
that number.

`x * 8 ** -0.5` and `x / sqrt(8)` hold different constants: c = 0.35355338 and q = 2.8284271 in f32,
and c * q is not 1 over the reals. But c is exactly what the dtype's division 1 / q gives (IEEE
division rounds correctly), so `x * c` is `x * (1 / q)` with the reciprocal rounded as every op
of the program is, and over the reals x * (1 / q) = x / q. This is the one rounding of a constant
folded at trace time (`1 / math.sqrt(k)`, `k ** -0.5`) read as the op it folds; the product is
stated equal to the quotient only where the rounding runs both ways, c = fl(1 / q) and
q = fl(1 / c), so that each constant c names one divisor and two distinct products or two distinct
quotients are never made equal. A constant that is a power of two is its reciprocal's exact inverse
already (the builder keeps x / 8 as 0.125 * x).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.translate.builder import SCALABLE, Builder, Value, power_of_two


def divisor_of(factor: Fraction, dtype: str) -> Fraction | None:
    """q with factor = fl(1 / q) and q = fl(1 / factor) in `dtype`, for a factor that is no power of
    two; None when there is none."""
    if dtype not in SCALABLE or factor == 0 or factor == power_of_two(factor):
        return None
    kind = NP_DTYPES[dtype]
    with np.errstate(all="ignore"):
        c = kind(float(factor))
        one = kind(1)
        q = one / c
        if Fraction(float(c)) != factor or not np.isfinite(q) or one / q != c:
            return None
    return Fraction(float(q))


def note(ev: Builder, result: Value) -> None:
    """State an op's result base * c, c the rounded reciprocal of q, equal to base / q: a scale the
    program applies itself or that the builder pulled in front (out of a dot of scaled queries)."""
    if not isinstance(result, Term) or result in ev.quotients:
        return
    factor, base = ev.scale_of(result)
    if base is result or (divisor := divisor_of(factor, result.dtype)) is None:
        return
    # the quotient of the unreshaped value, reshaped: an elementwise op by a constant of one value
    # moves every element in place (dot_product_attention scales its [B, N, T, 1, S] scores, the
    # reference its [B, N, T, S] ones)
    inner = base.args[0] if base.op == "reshape" else base
    quotient = ev.divided(inner, 1 / divisor, Shape(result.dtype, inner.shape))
    if quotient is not None and inner is not base:
        quotient = ev.reshape_term(quotient, Shape(result.dtype, result.shape))
    if quotient is not None:
        ev.quotients[result] = quotient
        ev.equal_terms.append([result, quotient])
