"""A top-k merged from the pieces' own top-k (equivci/translate/sorts.merged_top, picks.sorted_pick):
the first k of a stable sort of pieces concatenated in order are the first k of the sort of each
piece's first k_i >= k, and the candidates' indices, shifted by the piece's offset and picked at the
merge's positions, are the whole's indices, ties in index order alike. A vocabulary-sharded beam
step takes a top-k per shard, all-gathers the candidates and takes their top-k.

Checked against XLA with ties across and within the pieces, and never stated where it does not
hold: more than a piece's k_i asked for, the candidates' indices paired with another piece's, or
shifted by another offset.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from one_device import programs as _programs

from equivci.terms.semantics import evaluate

K = 3
TIES = np.array(
    [
        [1.0, 2.0, 2.0, 0.5, 2.0, 1.0, -3.0, 0.0, 2.0, 2.0, 1.0, 0.0],
        [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0],
        [0.1, -1.0, 4.0, 4.0, -1.0, 0.1, 7.0, 7.0, 4.0, 7.0, 0.0, 7.0],
    ],
    dtype=np.float32,
)
RANDOM = np.random.default_rng(3).standard_normal((4, 12)).astype(np.float32)


def two_stage(x, *, pieces=3, k_piece=K, k=K, offsets=None, order=None, start=0):
    """top_k of x as each piece's top_k (from `start` on), its indices shifted to x's,
    concatenated, then the top_k of the candidates and their indices picked at its positions."""
    n = x.shape[1] // pieces
    tops = [[t[:, start:] for t in lax.top_k(x[:, p * n : (p + 1) * n], k_piece)] for p in range(pieces)]
    offsets = offsets or [p * n for p in range(pieces)]
    order = order or list(range(pieces))
    values = jnp.concatenate([tops[p][0] for p in range(pieces)], axis=1)
    ids = jnp.concatenate([tops[p][1] + offsets[p] for p in order], axis=1)
    top, pos = lax.top_k(values, k)
    return top, jnp.take_along_axis(ids, pos, axis=1)


def _terms(fn, x) -> list[tuple[str, set[str]]]:
    """For each output of fn, its term and the set of it and the terms the translation states
    equal to it, written out; each checked against what XLA computes."""
    found = []
    for k in range(2):
        programs, want, _ = _programs(lambda x: fn(x)[k], (x,))
        (out,) = programs.reference_outputs
        values = programs.evaluator.values
        np.testing.assert_array_equal(evaluate(out, {0: x}, values), want)
        stated = [t for group in programs.evaluator.equal_terms if out in group for t in group]
        for t in stated:  # every fact stated holds on these inputs
            np.testing.assert_array_equal(evaluate(t, {0: x}, values), want)
        found.append((repr(out), {repr(out), *map(repr, stated)}))
    return found


@pytest.mark.parametrize("x", [TIES, RANDOM], ids=["ties", "random"])
@pytest.mark.parametrize("k_piece", [K, K + 1])
def test_a_merge_of_pieces_top_k_is_the_top_k(x, k_piece):
    (values, _), (indices, _) = _terms(lambda x: lax.top_k(x, K), x)
    (_, merged_values), (_, merged_indices) = _terms(lambda x: two_stage(x, k_piece=k_piece), x)
    assert values in merged_values
    assert indices in merged_indices


NOT_THE_TOP_K = {
    "more asked than each piece keeps": dict(k_piece=2, k=3),
    "indices paired with another piece's": dict(order=[1, 0, 2]),
    "indices shifted by another offset": dict(offsets=[0, 3, 8]),
    "candidates from each piece's second on": dict(k_piece=4, start=1),
}


@pytest.mark.parametrize("case", sorted(NOT_THE_TOP_K))
def test_no_merge_where_it_does_not_hold(case):
    kwargs = NOT_THE_TOP_K[case]
    k = kwargs.get("k", K)
    (values, _), (indices, _) = _terms(lambda x: lax.top_k(x, k), TIES)
    (_, merged_values), (_, merged_indices) = _terms(lambda x: two_stage(x, **kwargs), TIES)
    assert indices not in merged_indices
    differs = np.asarray(jax.jit(lambda x: jnp.stack(two_stage(x, **kwargs)[1:]))(TIES))
    assert not np.array_equal(differs[0], np.asarray(jax.jit(lambda x: lax.top_k(x, k)[1])(TIES)))
