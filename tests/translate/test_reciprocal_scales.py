"""A product by the dtype's rounded reciprocal of a number is the quotient by that number
(equivci.translate.reciprocals): `s * 8 ** -0.5` holds c = fl(1 / q) for q = fl(sqrt(8)), the
constant `s / jnp.sqrt(8.)` divides by, and q = fl(1 / c); the product is stated equal to the
quotient as the builder writes it. Not an identity of the written constants over the reals (c * q
is not 1): the constant is read as the division 1 / q the dtype rounds, as every op is rounded.

Checked on the terms the evaluator builds against XLA's values of both programs, for a scale the
program applies and one the builder pulls out of a dot of scaled queries; nothing is stated for a
power of two (x / 8 is 0.125 * x already) or for a constant whose reciprocal does not round back to
it (1.8999999 = 1.9 less one ulp: both round to the same divisor, only 1.9 is its reciprocal).
Verdicts on models (attention scaled by `HD ** -0.5` and by `1 / math.sqrt(HD)` against the
reference's `/ jnp.sqrt(HD)`, scaled twice, a scale one ulp off) are near misses in tests/soundness.
"""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator
from equivci.translate.reciprocals import divisor_of

RNG = np.random.default_rng(3)
S = RNG.standard_normal((2, 4, 4)).astype(np.float32)
Q = RNG.standard_normal((4, 8)).astype(np.float32)
K = RNG.standard_normal((8, 4)).astype(np.float32)
F32 = np.float32


def test_the_divisor_of_a_rounded_reciprocal_is_the_number_it_rounds_from_both_ways() -> None:
    assert divisor_of(Fraction(float(F32(8**-0.5))), "f32") == Fraction(float(F32(np.sqrt(8))))
    assert divisor_of(Fraction(float(F32(1 / 3))), "f32") == 3
    assert divisor_of(Fraction(1, 8), "f32") is None  # a power of two: its own exact reciprocal
    assert divisor_of(Fraction(float(F32(1.9))), "f32") == Fraction(float(F32(1) / F32(1.9)))
    nudged = np.nextafter(F32(1.9), F32(0))
    assert F32(1) / nudged == F32(1) / F32(1.9)  # one divisor for both, only 1.9 its rounded reciprocal
    assert divisor_of(Fraction(float(nudged)), "f32") is None
    assert divisor_of(Fraction(float(F32(8**-0.5))), "s32") is None  # integers are not scaled


def _stated(fn, *args, table: TermTable | None = None):
    """fn's evaluator, its quotient groups, its output's term (one device) and the input values."""
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable() if table is None else table, 1)
    params = [
        ev.table.make("param", (k,), (), np.shape(a), module.entry.parameters()[k].shape.dtype)
        for k, a in enumerate(args)
    ]
    outputs = ev.run(module.entry, [[p] for p in params])
    groups = [[term, quotient] for term, quotient in ev.quotients.items()]
    return ev, groups, outputs[0], {k: np.asarray(a) for k, a in enumerate(args)}


SCALED = {
    "scores scaled by hd ** -0.5": (lambda s: s * 8**-0.5, lambda s: s / jnp.sqrt(8.0), (S,)),
    "a mean by 1 / 3": (lambda s: s * (1 / 3), lambda s: s / 3.0, (S,)),
    "queries scaled before the dot": (lambda q, k: (q * 8**-0.5) @ k, lambda q, k: (q @ k) / jnp.sqrt(8.0), (Q, K)),
}


@pytest.mark.parametrize("case", sorted(SCALED))
def test_a_product_by_a_rounded_reciprocal_is_stated_as_the_quotient_xla_computes(case) -> None:
    product, quotient, args = SCALED[case]
    table = TermTable()
    ev, groups, output, values = _stated(product, *args, table=table)
    assert output in ev.quotients, "no quotient stated for the output"
    for term, stated in groups:  # within one rounding of the scale
        assert stated.op == "binary" and stated.attrs == ("divide",)
        np.testing.assert_allclose(evaluate(stated, values, ev.values), evaluate(term, values, ev.values), rtol=3e-7)
    expected = np.asarray(jax.jit(quotient)(*args))
    np.testing.assert_allclose(evaluate(ev.quotients[output], values, ev.values), expected, rtol=3e-7)
    # the quotient stated is the very term of the program that divides
    _, _, written, _ = _stated(quotient, *args, table=table)
    assert written is ev.quotients[output]


NOT_STATED = {
    "a power of two": lambda s: s * 0.125,
    "a scale one ulp below 1.9": lambda s: s * float(np.nextafter(F32(1.9), F32(0))),
}


@pytest.mark.parametrize("case", sorted(NOT_STATED))
def test_no_quotient_is_stated_for_a_power_of_two_or_a_constant_that_is_no_rounded_reciprocal(case) -> None:
    _, groups, _, _ = _stated(NOT_STATED[case], S)
    assert not groups
