"""An argmax combined from pieces (equivci/translate/argmax_pieces.py): each piece's argmax offset by
its start, picked at the first argmax of the pieces' maxima, is the argmax of the whole, ties to the
first position alike. A vocabulary-sharded greedy step writes it with an all_gather of each shard's
(id, max) and a pick of the winner's id.

Checked against XLA with ties across and within the pieces, in two styles (stacked candidates and a
`jnp.take_along_axis` of concatenated ones), and never stated where it does not hold: offsets that are
not the pieces' starts, ids paired with another piece's maxima, a winner by argmin, pieces' argmaxes
that keep the last of ties (jnp.argmax keeps the first). The same winner combined with `pmax` and
`pmin` (`argmax_pieces.owner_min`: the smallest offset argmax among the shards whose max is the
largest) verifies end to end on four shards, and its near misses are mismatches: shard-local ids,
the shards' maxima tested against the largest of their minima.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from jax import lax
from model_package import verify_named as _verify
from one_device import programs as _programs

from equivci.results import Status
from equivci.terms.ir import Term

# values in {0, 1, 2}: ties within and across the pieces; the last row all one value
TIES = np.vstack([np.floor(np.random.default_rng(7).uniform(0, 3, (3, 12))), np.full((1, 12), 3.0)]).astype(np.float32)
RANDOM = np.random.default_rng(5).standard_normal((4, 12)).astype(np.float32)


def last_argmax(x, axis=-1):
    """An argmax whose reducer keeps the larger index of a tie: the last position of the largest value."""

    def keep(a, b):
        take_a = (a[0] > b[0]) | ((a[0] == b[0]) & (a[1] > b[1]))
        return lax.select(take_a, a[0], b[0]), lax.select(take_a, a[1], b[1])

    positions = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return lax.reduce((x, positions), (np.float32(-np.inf), np.int32(0)), keep, (x.ndim - 1,))[1]


def stacked(x, *, pieces=3, offsets=None, order=None, pick=jnp.argmax, local=jnp.argmax):
    """argmax of x's rows from each piece's (argmax + offset, max), stacked on a new last dim
    (slot j: the ids of piece order[j], offset by offsets[j])."""
    n = x.shape[1] // pieces
    parts = [x[:, p * n : (p + 1) * n] for p in range(pieces)]
    offsets = offsets or [p * n for p in range(pieces)]
    order = order or list(range(pieces))
    ids = jnp.stack([local(parts[p], -1) + offsets[j] for j, p in enumerate(order)], -1)
    maxima = jnp.stack([jnp.max(q, -1) for q in parts], -1)
    return jnp.take_along_axis(ids, pick(maxima, -1)[:, None], -1)[:, 0]


def concatenated(x, *, pieces=2, shift=0):
    """The same with keepdims pieces concatenated along the lane, and a shift of every id."""
    n = x.shape[1] // pieces
    parts = [x[:, p * n : (p + 1) * n] for p in range(pieces)]
    ids = jnp.concatenate([jnp.argmax(q, -1, keepdims=True) + p * n + shift for p, q in enumerate(parts)], -1)
    maxima = jnp.concatenate([jnp.max(q, -1, keepdims=True) for q in parts], -1)
    return jnp.take_along_axis(ids, jnp.argmax(maxima, -1, keepdims=True), -1)[:, 0]


def _stated(fn, x) -> tuple[str, set[str]]:
    """fn's output term and the terms the translation states equal to it, written out (an argmax's
    reducer has no numpy model: what XLA computes is checked by the tests themselves)."""
    out, stated = _stated_terms(fn, x)
    return repr(out), {repr(out), *map(repr, stated)}


def _stated_terms(fn, x) -> tuple[Term, list[Term]]:
    programs, _, _ = _programs(fn, (x,))
    (out,) = programs.reference_outputs
    return out, [t for group in programs.evaluator.equal_terms if out in group for t in group]


def _argmaxes_as_wide_as(terms: list[Term], shape: tuple[int, ...]) -> list[Term]:
    """The two-operand reduces (argmaxes) over a value of `shape` inside the terms."""
    found, stack = [], list(terms)
    while stack:
        t = stack.pop()
        if t.op == "aligned" and t.attrs[0].startswith("reduce2") and t.args[0].shape == shape:
            found.append(t)
        stack.extend(t.args)
    return found


def _xla(fn, x) -> np.ndarray:
    return np.asarray(jax.jit(fn)(x))


@pytest.mark.parametrize("x", [TIES, RANDOM], ids=["ties", "random"])
@pytest.mark.parametrize("style", [stacked, concatenated])
def test_a_pick_at_the_argmax_of_the_pieces_maxima_is_the_argmax(x, style):
    np.testing.assert_array_equal(_xla(style, x), _xla(lambda x: jnp.argmax(x, -1), x))
    whole, _ = _stated(lambda x: jnp.argmax(x, -1), x)
    _, combined = _stated(style, x)
    assert whole in combined


def test_a_shift_of_every_id_is_the_argmax_shifted():
    np.testing.assert_array_equal(
        _xla(lambda x: concatenated(x, shift=5), TIES), _xla(lambda x: jnp.argmax(x, -1), TIES) + 5
    )
    shifted, _ = _stated(lambda x: jnp.argmax(x, -1) + 5, TIES)
    _, combined = _stated(lambda x: concatenated(x, shift=5), TIES)
    assert shifted in combined


NOT_THE_ARGMAX = {
    "offsets that are not the pieces' starts": dict(offsets=[0, 3, 8]),
    "ids paired with another piece's maxima": dict(order=[1, 0, 2]),
    "the winner taken by argmin": dict(pick=jnp.argmin),
    "the pieces' argmaxes keeping the last of ties": dict(local=last_argmax),
}


@pytest.mark.parametrize("case", sorted(NOT_THE_ARGMAX))
def test_no_combined_argmax_where_it_does_not_hold(case):
    wrong = lambda x: stacked(x, **NOT_THE_ARGMAX[case])  # noqa: E731
    assert not np.array_equal(_xla(wrong, TIES), _xla(lambda x: jnp.argmax(x, -1), TIES))
    whole, _ = _stated(lambda x: jnp.argmax(x, -1), TIES)
    _, combined = _stated(wrong, TIES)
    assert whole not in combined
    # nor any argmax as wide as x, of its pieces in any order (the pieces' own read its slices)
    assert not _argmaxes_as_wide_as(_stated_terms(wrong, TIES)[1], TIES.shape)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P


    def inputs():
        return (jax.ShapeDtypeStruct((8, 64), jnp.float32),)


    def greedy(logits):
        return jnp.argmax(logits, -1)


    def _owner_min(logits, offset, against):
        local_max = logits.max(-1)
        top = lax.pmax(against(logits), "tp")
        ids = jnp.argmax(logits, -1) + offset * lax.axis_index("tp")
        return lax.pmin(jnp.where(local_max == top, ids, jnp.iinfo(jnp.int32).max), "tp")


    def _run(offset, against):
        def run(logits, *, mesh):
            local = lambda l: _owner_min(l, offset, against)
            return jax.shard_map(local, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(), check_vma=False)(logits)

        return run


    greedy_pmin = _run(16, lambda l: l.max(-1))
    greedy_pmin_local_index = _run(0, lambda l: l.max(-1))
    greedy_pmin_against_min = _run(16, lambda l: l.min(-1))
    """
)

CASES = [(name, "greedy", name) for name in ("greedy_pmin", "greedy_pmin_local_index", "greedy_pmin_against_min")]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES, "{tp: 4}")
    return model_package.write_package(tmp_path_factory.mktemp("owner_min"), "model.py", MODELS, text)


def test_the_smallest_offset_argmax_of_the_shards_holding_the_max_verifies(manifest):
    result = _verify(manifest, "greedy_pmin")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.slow
@pytest.mark.parametrize("name", ["greedy_pmin_local_index", "greedy_pmin_against_min"])
def test_shard_local_ids_or_another_maximum_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (name, result.findings)
