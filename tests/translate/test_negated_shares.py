"""A sum over devices of each device's negated share is the negated sum: sum_d (-x_d) = -(sum_d x_d),
exact in floats too (rounding to nearest is symmetric). A data shard's `-mean(...)` loss, pmean-ed,
then meets the reference's negated mean (translate/collectives.py, `combine`). Checked on the builder
(the form, evaluated, is the written sum; a sum with one share not negated is left as written); end
to end in two styles and with the 1/n missing or the sign against a positive reference by the near
misses neg-loss-dp* of tests/soundness."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.builder import Builder
from equivci.translate.collectives import combine

RNG = np.random.default_rng(13)
S = Shape("f32", (3, 4))


def _fold(members):
    acc = members[0]
    for m in members[1:]:
        acc = acc + m
    return acc


def test_the_sum_of_negated_shares_is_the_negated_sum():
    ev = Builder(None, TermTable(), 4)  # type: ignore[arg-type]
    shares = [ev.table.make("param", (k,), (), S.dims, "f32") for k in range(4)]
    members = [ev.normal("unary", ("negate",), [x], S) for x in shares]
    total = combine(ev, "add", members)
    assert total.op == "unary" and total.attrs == ("negate",)
    assert total.args[0] == combine(ev, "add", shares)
    values = {k: RNG.standard_normal(S.dims).astype(np.float32) for k in range(4)}
    written = _fold([-values[k] for k in range(4)])
    np.testing.assert_array_equal(evaluate(total, values), written)  # exact: the same roundings, negated


def test_a_sum_with_one_share_not_negated_is_not_the_negated_sum():
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    x, y = (ev.table.make("param", (k,), (), S.dims, "f32") for k in range(2))
    total = combine(ev, "add", [ev.normal("unary", ("negate",), [x], S), y])
    values = {k: RNG.standard_normal(S.dims).astype(np.float32) for k in range(2)}
    np.testing.assert_allclose(evaluate(total, values), -values[0] + values[1], rtol=1e-6)


def test_negated_shares_under_one_factor_are_the_negated_sum_under_it():
    # each device's mean of its negated picks: (1/n) * (-x_d), the factor in front as the builder keeps it
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    shares = [ev.table.make("param", (k,), (), S.dims, "f32") for k in range(2)]
    members = [ev.scaled(ev.normal("unary", ("negate",), [x], S), Fraction(1, 8)) for x in shares]
    total = combine(ev, "add", members)
    factor, base = ev.scale_of(total)
    assert factor == Fraction(1, 8) and base.op == "unary" and base.attrs == ("negate",)
    values = {k: RNG.standard_normal(S.dims).astype(np.float32) for k in range(2)}
    np.testing.assert_allclose(evaluate(total, values), -(values[0] + values[1]) / 8, rtol=1e-6)


def test_negated_shares_under_different_factors_are_left_as_written():
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    x, y = (ev.table.make("param", (k,), (), S.dims, "f32") for k in range(2))
    members = [ev.scaled(ev.normal("unary", ("negate",), [t], S), Fraction(f)) for t, f in ((x, 1 / 8), (y, 1 / 4))]
    total = combine(ev, "add", members)
    values = {k: RNG.standard_normal(S.dims).astype(np.float32) for k in range(2)}
    np.testing.assert_allclose(evaluate(total, values), -values[0] / 8 - values[1] / 4, rtol=1e-6)
