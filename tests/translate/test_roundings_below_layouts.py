"""Float converts built below relayouts and concatenations (translate/elementwise.py: convert): a
rounding is elementwise, so the rounding of a reshape, a transpose or a concatenation is that op of
the roundings, and a splat that bf16 holds exactly is the same splat in bf16 (numpy folds no bf16);
one that bf16 does not hold stays a rounding."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from one_device import evaluated

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.elementwise import convert
from equivci.translate.evaluator import Evaluator


def _root(fn, *args):
    ev, values = evaluated(fn, [np.asarray(a) for a in args])
    return ev, ev.events[-1].values[0], values


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.reshape(4, 6).astype(jnp.float16),
        lambda x: x.T.astype(jnp.float16),
        lambda x: jnp.concatenate([x[:1], x, x[-1:]], axis=0).astype(jnp.float16),
    ],
    ids=["reshape", "transpose", "concatenate"],
)
def test_a_rounding_of_a_relayout_is_the_relayout_of_the_rounding(fn):
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    _, term, values = _root(fn, x)
    assert term.op in ("reshape", "transpose", "concat") and term.dtype == "f16"
    converts = [t for t in _subterms(term) if t.op == "unary" and t.attrs == ("convert",)]
    assert converts and all(t.args[0].op in ("param", "slice") for t in converts)  # on the input or its windows
    np.testing.assert_array_equal(evaluate(term, values), np.asarray(fn(x)))


def _subterms(t):
    seen, stack = [], [t]
    while stack:
        u = stack.pop()
        seen.append(u)
        stack.extend(u.args)
    return seen


@pytest.mark.parametrize("number, exact", [(0.0, True), (0.5, True), (-3.0, True), (0.1, False), (1 + 2**-10, False)])
def test_a_splat_bf16_holds_is_a_bf16_splat_and_one_it_does_not_stays_rounded(number, exact):
    ev = Evaluator(None, TermTable(), 1)  # type: ignore[arg-type]  # no module: terms only
    splat = ev.const(np.full((2, 3), number, np.float32), "f32")
    term = convert(ev, Instruction("c", "convert", Shape("bf16", (2, 3)), (), {}), [splat], 0)
    assert term.dtype == "bf16"
    if exact:
        assert float(ev.folded(term).flat[0]) == number
    else:
        assert ev.folded(term) is None and term.op == "unary"
