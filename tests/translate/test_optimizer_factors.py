"""Constant factors through an optimizer step's gradient (equivci.translate.builder).

* select(p, c, 0) = c * select(p, 1, 0) for a splat c (`Builder.factored_select`): the cotangent
  `jnp.where` hands a mean loss's two branches is 1/n on a shard of n rows and 1/N in the
  reference; with the splat in front, the shard's select is 4 x a window of the reference's and a
  pmean's 1/4 meets it. Two non-zero splats keep their form (no common factor).
* A product of many constants that is no number of the dtype (`Builder.times`) keeps each factor's
  significand, in [1, 2), inside and the power of two that is left in front. With odd parts
  inside instead (up to 2^24 each), the power of two in front of a gradient through GELU, a mean
  and decayed moments left float32's range (2^-164), and the shard's and the reference's products
  kept different bases.

Each form is checked against the values as written (float64 and XLA)."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from equivci.hlo.ir import Shape
from equivci.hlo.parser import parse_module
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

R = np.random.default_rng(7).standard_normal((8, 1)).astype(np.float32) * 2


def _huber_cotangent(scale: float, other: float = 0.0):
    def fn(r):
        return jnp.where(jnp.abs(r) < 1.0, jnp.float32(scale), jnp.float32(other))

    return fn


def _term(fn, table: TermTable):
    module = parse_module(jax.jit(fn).lower(R).as_text(dialect="hlo"))
    ev = Evaluator(module, table, 1)
    param = ev.table.make("param", (0,), (), R.shape, "f32")
    return ev, ev.run(module.entry, [[param]])[0]


def test_a_select_of_a_splat_beside_zero_is_the_splat_times_the_select_of_one() -> None:
    table = TermTable()
    shard_ev, shard = _term(_huber_cotangent(1 / 4), table)
    whole_ev, whole = _term(_huber_cotangent(1 / 16), table)
    (f_shard, base), (f_whole, base_whole) = shard_ev.scale_of(shard), whole_ev.scale_of(whole)
    assert base is base_whole and (f_shard, f_whole) == (Fraction(1, 4), Fraction(1, 16))
    assert base.op == "ternary" and base.attrs == ("select",)
    for ev, term, scale in ((shard_ev, shard, 1 / 4), (whole_ev, whole, 1 / 16)):
        expected = np.asarray(jax.jit(_huber_cotangent(scale))(R))
        np.testing.assert_array_equal(evaluate(term, {0: R}, ev.values), expected)
    # the zero branch first (the select of the other branch of `where`) alike
    flipped_ev, flipped = _term(lambda r: jnp.where(jnp.abs(r) < 1.0, 0.0, jnp.float32(0.25)), table)
    assert flipped_ev.scale_of(flipped)[0] == Fraction(1, 4)
    np.testing.assert_array_equal(evaluate(flipped, {0: R}, flipped_ev.values), np.where(np.abs(R) < 1, 0, 0.25))


def test_a_select_of_two_non_zero_splats_keeps_its_form() -> None:
    table = TermTable()
    ev, term = _term(_huber_cotangent(1 / 4, 1 / 2), table)
    assert ev.scale_of(term)[0] == 1 and term.op == "ternary"
    np.testing.assert_array_equal(evaluate(term, {0: R}, ev.values), np.asarray(jax.jit(_huber_cotangent(0.25, 0.5))(R)))


# float32 constants of an AdamW step through GELU's gradient: each has an odd part near 2^23
CONSTANTS = (0.7978846, 0.044715, 0.1, 0.9, 0.001, 0.999, 0.3)


def _chain(ev, x, scale: float):
    """x scaled by `scale`, then by every constant, one product at a time, as the builder folds them."""
    shape = Shape("f32", x.shape)
    t = ev.scaled(x, Fraction(scale))
    for k in CONSTANTS:
        t = ev.normal("binary", ("multiply",), [t, ev.const(np.full(x.shape, k, np.float32), "f32")], shape)
        t = ev.normal("binary", ("multiply",), [t, t], shape) if k == 0.1 else t
    return t


def test_many_constant_factors_leave_one_base_and_a_power_of_two_in_range() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (4, 6), "f32")
    shard, whole, odd = _chain(ev, x, 1 / 4), _chain(ev, x, 1 / 16), _chain(ev, x, 3 / 16)
    assert ev.scale_of(shard)[1] is ev.scale_of(whole)[1]
    assert ev.scale_of(shard)[0] == 16 * ev.scale_of(whole)[0]  # (1/4)^2 against (1/16)^2: squared at 0.1
    assert ev.scale_of(odd)[1] is not ev.scale_of(whole)[1]  # an odd factor more: another base
    params = {0: np.random.default_rng(1).standard_normal((4, 6))}
    for scale, term in ((1 / 4, shard), (1 / 16, whole), (3 / 16, odd)):
        written = params[0] * float(np.float32(scale))
        for k in CONSTANTS:
            written = written * float(np.float32(k))
            written = written * written if k == 0.1 else written
        np.testing.assert_allclose(evaluate(term, params, ev.values), written, rtol=1e-5)
