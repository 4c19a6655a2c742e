"""select(p, c, x) is select(not p, x, c) for a constant predicate p, a constant c and an x that is
not (equivci.translate.elementwise.constant_branch_last): exact, each element takes the same
branch's value. A causal mask written as the keys to hide, `where(triu(k=1), -big, s)` or
`where(k > q, -inf, s)`, is then the very term of the reference's `where(tril, s, -big)`; the
negation stays under the mask's broadcast, so the device's table is the reference's.

Checked on the terms (one table for both programs: hash-consed terms are one object) and against
XLA's values; near misses: the diagonal hidden too (triu(k=0)), the kept keys hidden (tril where
triu belongs), and a predicate that is no constant, whose select keeps its written order. Verdicts
on models are near misses in tests/soundness (attention-masked-*).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

T = 4
SCORES = np.random.default_rng(5).standard_normal((2, 3, T, T)).astype(np.float32)
NEG = -1e30


def _term(fn, table: TermTable) -> tuple[Term, dict]:
    module = parse_module(jax.jit(fn).lower(SCORES).as_text(dialect="hlo"))
    ev = Evaluator(module, table, 1)
    param = ev.table.make("param", (0,), (), SCORES.shape, "f32")
    return ev.run(module.entry, [[param]])[0], ev.values


def reference(s):
    return jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, NEG)


def _positions():
    pos = jnp.arange(T)
    return pos[:, None], pos[None, :]


HIDDEN_KEYS = {
    "triu(k=1) hidden": lambda s: jnp.where(jnp.triu(jnp.ones((T, T), bool), k=1), NEG, s),
    "keys past the query hidden": lambda s: jnp.where(_positions()[1] > _positions()[0], NEG, s),
    "not of the causal mask hidden": lambda s: jnp.where(~jnp.tril(jnp.ones((T, T), bool)), NEG, s),
}


@pytest.mark.parametrize("case", sorted(HIDDEN_KEYS))
def test_a_mask_of_the_keys_to_hide_is_the_reference_mask_of_the_keys_to_keep(case) -> None:
    table = TermTable()
    written, values = _term(HIDDEN_KEYS[case], table)
    kept, _ = _term(reference, table)
    assert written is kept
    np.testing.assert_array_equal(
        evaluate(written, {0: SCORES}, values), np.asarray(jax.jit(HIDDEN_KEYS[case])(SCORES))
    )


NEAR_MISSES = {
    "the diagonal hidden too": lambda s: jnp.where(jnp.triu(jnp.ones((T, T), bool)), NEG, s),
    "the kept keys hidden": lambda s: jnp.where(jnp.tril(jnp.ones((T, T), bool)), NEG, s),
    "a predicate of the scores": lambda s: jnp.where(s > 0, NEG, s),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_other_masks_are_other_terms_and_keep_their_values(case) -> None:
    table = TermTable()
    written, values = _term(NEAR_MISSES[case], table)
    kept, _ = _term(reference, table)
    assert written is not kept
    np.testing.assert_array_equal(
        evaluate(written, {0: SCORES}, values), np.asarray(jax.jit(NEAR_MISSES[case])(SCORES))
    )


def test_a_select_of_a_predicate_that_is_no_constant_keeps_its_written_order() -> None:
    written, _ = _term(NEAR_MISSES["a predicate of the scores"], TermTable())
    assert written.op == "ternary" and written.args[2].op == "param"
