"""A dot where one operand has no free dims as the sum of a product (reductions.product_sum),
checked against XLA (each program's terms and every group it states equal):

    dot(a[b, c], m[b, c, f]) = sum_c m[b, c, f] * a[b, c]

A top-k combine written as `einsum("tk,tke->te", w, one_hot(idx, E))` then meets the scatter
`zeros.at[rows, idx].add(w)` (one_hots.py's sum of one-hots), with idx from lax.top_k or from
argsort(-p); an einsum with the one-hot of other indices, or a combine of the weights of other
picks, never does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from one_device import programs as _programs

from equivci.terms.semantics import TermEvalError, evaluate

T, E, K = 6, 5, 2
RNG = np.random.default_rng(3)
LOGITS = RNG.standard_normal((T, E)).astype(np.float32)
LOGITS[1] = LOGITS[1, 0]  # a row of ties


def _scatter_combine(logits):
    w, idx = lax.top_k(jax.nn.softmax(logits, axis=-1), K)
    return jnp.zeros((T, E)).at[jnp.arange(T)[:, None], idx].add(w)


def _top_k(p):
    return lax.top_k(p, K)


def _by_argsort(p):
    idx = jnp.argsort(-p, axis=-1)[:, :K]
    return jnp.take_along_axis(p, idx, axis=-1), idx


def _einsum_combine(top):
    def combine(logits):
        w, idx = top(jax.nn.softmax(logits, axis=-1))
        return jnp.einsum("tk,tke->te", w, jax.nn.one_hot(idx, E))

    return combine


def _one_hot_first(logits):
    w, idx = _top_k(jax.nn.softmax(logits, axis=-1))
    return jnp.einsum("tke,tk->te", jax.nn.one_hot(idx, E), w)


def _other_picks(logits):  # the weights of the bottom-k at the top-k's columns
    p = jax.nn.softmax(logits, axis=-1)
    _, idx = _top_k(p)
    w = jnp.take_along_axis(p, jnp.argsort(p, axis=-1)[:, :K], axis=-1)
    return jnp.einsum("tk,tke->te", w, jax.nn.one_hot(idx, E))


def _shifted_columns(logits):  # the one-hot of idx + 1
    w, idx = _top_k(jax.nn.softmax(logits, axis=-1))
    return jnp.einsum("tk,tke->te", w, jax.nn.one_hot(idx + 1, E))


def _meets_the_scatter(fn) -> bool:
    """Whether, in one program computing both, fn's combine is stated equal to the scatter's
    (after checking the output and every stated group against XLA)."""
    programs, want, _ = _programs(lambda logits: jnp.stack([_scatter_combine(logits), fn(logits)]), (LOGITS,))
    values = programs.evaluator.values
    out = programs.reference_outputs[0]
    np.testing.assert_allclose(evaluate(out, {0: LOGITS}, values), want, rtol=1e-6, atol=1e-7)
    for group in programs.evaluator.equal_terms:
        first = evaluate(group[0], {0: LOGITS}, values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, {0: LOGITS}, values), first, rtol=1e-5, atol=1e-6)
    scatter, combine = out.args[0].args  # reshape(concat(scatter, combine))
    return combine is scatter or any(combine in g and scatter in g for g in programs.evaluator.equal_terms)


@pytest.mark.parametrize(
    "fn",
    [_einsum_combine(_top_k), _one_hot_first],
    ids=["top_k", "one-hot first"],
)
def test_an_einsum_of_one_hots_meets_the_scatter_combine(fn):
    # (with argsort(-p)'s picks the weights are a quotient the e-graph moves: end to end in
    # tests/soundness, route-argsort-combine)
    assert _meets_the_scatter(fn)
    np.testing.assert_allclose(
        np.asarray(jax.jit(fn)(LOGITS)), np.asarray(jax.jit(_scatter_combine)(LOGITS)), rtol=1e-6
    )


@pytest.mark.parametrize("fn", [_other_picks, _shifted_columns], ids=["other picks", "shifted columns"])
def test_no_combine_for_other_weights_or_columns(fn):
    assert not _meets_the_scatter(fn)
    assert not np.allclose(np.asarray(jax.jit(fn)(LOGITS)), np.asarray(jax.jit(_scatter_combine)(LOGITS)))


def test_a_dot_with_free_dims_on_both_sides_is_no_product_sum():
    def matmul(logits):
        return logits @ logits.T

    programs, _, _ = _programs(matmul, (LOGITS,))
    assert not any(t.op == "reduce" for g in programs.evaluator.equal_terms for t in g)


def test_a_sum_laid_out_other_than_the_dot_is_transposed_or_not_stated():
    """einsum("tk,etk->te"): the other operand's batch dim t is not its first kept dim, so the sum
    over k of its product would be laid out [e, t]; every term stated equal keeps the dot's [t, e]."""
    hot = RNG.standard_normal((E, T, K)).astype(np.float32)

    def dot(logits, hot):
        return jnp.einsum("tk,etk->te", logits[:, :K], hot)

    programs, want, _ = _programs(dot, (LOGITS, hot))
    values, params = programs.evaluator.values, {0: LOGITS, 1: hot}
    np.testing.assert_allclose(evaluate(programs.reference_outputs[0], params, values), want, rtol=1e-5)
    for group in programs.evaluator.equal_terms:
        for term in group:
            try:
                got = evaluate(term, params, values)
            except TermEvalError as err:  # a term whose dims do not compose as it says
                raise AssertionError(f"a term stated equal to the dot has no value of its layout: {err}") from err
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
