"""Sort-based dispatch (equivci/translate/permutations.py): the identities it states, checked on
random draws, and what it relates on a program. The verdicts of correct and buggy layers (an
inclusive group end, an un-sort by the permutation itself, gates in sorted order, rows added back
into ones or at the inverse's rows) are near misses in tests/soundness (near_miss.yaml)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

SOUNDNESS = Path(__file__).resolve().parents[1] / "soundness"


def _draw(rng, n=12, e=4, d=3):
    v = rng.integers(0, e, n)
    return v, rng.standard_normal((n, d)), np.argsort(v, kind="stable")


@pytest.mark.parametrize("seed", range(20))
def test_segment_bounds_are_the_sorted_one_hot(seed):
    """starts[e] <= b < ends[e] (ends = cumsum(bincount(v)), starts = ends - counts) iff v[P][b] == e."""
    rng = np.random.default_rng(seed)
    v, _, perm = _draw(rng)
    counts = np.bincount(v, minlength=4)
    assert np.array_equal(counts, (v[:, None] == np.arange(4)).sum(axis=0))  # the one-hot form
    ends = np.cumsum(counts)
    b = np.arange(len(v))[None, :]
    for starts in (ends - counts, np.concatenate([[0], ends[:-1]])):
        mask = (starts[:, None] <= b) & (b < ends[:, None])
        assert np.array_equal(mask, v[perm][None, :] == np.arange(4)[:, None])


@pytest.mark.parametrize("seed", range(20))
def test_putting_rows_back_undoes_the_permutation(seed):
    """f(X[P]) put back at P (a scatter, a scatter-add into zeros, a gather by argsort(P)) is f(X)
    for a row-wise f."""
    rng = np.random.default_rng(seed)
    v, x, perm = _draw(rng)
    w = rng.standard_normal((4, 3, 5))
    dense = np.einsum("td,tdf->tf", x, w[v])  # each row through its own expert
    rows = np.einsum("td,tdf->tf", x[perm], w[v[perm]])
    scattered = np.zeros_like(rows)
    scattered[perm] = rows
    added = rows.T @ np.eye(len(v))[perm]  # scatter_adds.windows: dot(V, onehot(P)) over the rows
    assert np.allclose(scattered, dense)
    assert np.allclose(added.T, dense)
    assert np.allclose(rows[np.argsort(perm)], dense)
    tokens = np.repeat(np.arange(6), 2)  # (token, choice) pairs: X[I[P]] is X[I], permuted
    assert np.allclose(x[:6][tokens[perm]], x[:6][tokens][perm])
    # the near misses of those guards differ
    assert not np.allclose(rows[perm], dense) or np.array_equal(perm, np.argsort(perm))


def test_facts_relate_both_programs_without_a_sort():
    """On a correct layer, the put-backs of the reference and of every device are related to
    row-wise values with no sort in them (what lets the rules relate them shard by shard)."""
    sys.path.insert(0, str(SOUNDNESS))
    from engine_api import capture, programs_of
    from near_miss_cases import MANIFEST

    from equivci.translate.permutations import Permutations

    programs = programs_of(capture(MANIFEST, "ragged-moe"))
    ev = programs.evaluator
    perms = Permutations(ev)
    perms.run([t for out in programs.device_outputs for t in out])
    assert len(perms.facts) == len(programs.device_outputs)  # one put-back per device
    for put_back, dense in perms.facts:
        assert put_back.shape == dense.shape
        assert not _ops(dense) & {"opaque"}, "the dense side still holds the scatter, cumsum or bincount"
        assert not any(a.op == "aligned" and "sort:" in a.attrs[0] for a in _subterms(dense))


def _subterms(t):
    seen, stack = {}, [t]
    while stack:
        u = stack.pop()
        if id(u) not in seen:
            seen[id(u)] = u
            stack.extend(u.args)
    return list(seen.values())


def _ops(t) -> set[str]:
    return {u.op for u in _subterms(t)}


@pytest.mark.parametrize("seed", range(20))
def test_counted_group_marks_are_the_sorted_ids(seed):
    """translate/group_ids.py: ones scattered at the groups' starts (dropped at n), counted
    cumulatively, are sorted(v) + 1; at the ends, sorted(v); jnp.repeat(arange(E), bincount(v), n)
    is sorted(v); arange(E)[i] = i. The near misses (ends minus one, a table from one) differ."""
    rng = np.random.default_rng(seed)
    v, _, perm = _draw(rng)
    n, e = len(v), 4
    counts = np.bincount(v, minlength=e)
    ends = np.cumsum(counts)
    starts = np.cumsum(np.concatenate([[0], counts[:-1]]))
    assert np.array_equal(starts, ends - counts)

    def counted(marks_at):
        marks = np.zeros(n + 1, dtype=np.int64)
        np.add.at(marks, marks_at, 1)
        return np.cumsum(marks[:n])  # index n is past the operand: a scatter drops it

    assert np.array_equal(counted(starts), v[perm] + 1)
    assert np.array_equal(counted(ends), v[perm])
    assert np.array_equal(np.repeat(np.arange(e), counts), v[perm])
    assert np.array_equal(np.arange(e)[v], v)
    assert not np.array_equal(counted(ends) - 1, v[perm])
    assert not np.array_equal(np.arange(1, e + 1)[v], v)


def test_a_scatter_index_is_a_group_bound_only_as_its_own_dtype_computes_it():
    """translate/group_ids.py reads the marks' scatter index g as the group bound b when g(k) = k for
    every k in [0, n] (a negative index's wrap, where(b < 0, b + n, b), is such a g). g is computed
    in b's dtype: for int8 b, b + 100 wraps below 0 from k = 28, so where(b + 100 < 0, 99, b) puts
    the marks of the later groups at row 99, not at b (in a wider dtype it would be b)."""
    from equivci.hlo.ir import Module
    from equivci.terms.ir import TermTable
    from equivci.translate.evaluator import Evaluator
    from equivci.translate.group_ids import _marks_at

    n, table = 40, TermTable()
    ev = Evaluator(Module.__new__(Module), table, 1)
    b = table.make("param", (0,), (), (4,), "s8")

    def const(k):
        return ev.const(np.full((4,), k, np.int8), "s8")

    def plus(x, k):
        return table.make("binary", ("add",), (x, const(k)), (4,), "s8")

    def where_negative(x, then, otherwise):
        p = table.make("binary", ("compare-LT:s8",), (x, const(0)), (4,), "pred")
        return table.make("ternary", ("select",), (p, then, otherwise), (4,), "s8")

    assert _marks_at(ev, where_negative(b, plus(b, n), b), b, n)
    assert _marks_at(ev, where_negative(plus(b, 80), const(99), b), b, n)  # b + 80 <= 120: no wrap
    assert not _marks_at(ev, where_negative(plus(b, 100), const(99), b), b, n)


@pytest.mark.parametrize(("cut", "kept"), [("columns", True), ("rows", False)])
def test_a_slice_keeps_a_permutation_only_across_the_permuted_rows(cut, kept):
    """X[P][:, :2] is X[:, :2] with its rows permuted by P; X[P][:6] is no permutation of any 6 rows
    of X (which rows it keeps depends on P)."""
    import jax
    import jax.numpy as jnp

    from equivci.hlo.parser import parse_module
    from equivci.terms.ir import TermTable
    from equivci.terms.semantics import evaluate
    from equivci.translate.evaluator import Evaluator
    from equivci.translate.permutations import Permutations
    from equivci.translate.programs import flatten

    rng = np.random.default_rng(5)
    x, v = rng.standard_normal((8, 3)).astype(np.float32), rng.integers(0, 4, 8).astype(np.int32)
    window = (slice(None), slice(0, 2)) if cut == "columns" else (slice(0, 6),)
    module = parse_module(jax.jit(lambda x, v: jnp.take(x, jnp.argsort(v), axis=0)[window]).lower(x, v).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    params = [[ev.table.make("param", (k,), (), a.shape, dtype)] for k, (a, dtype) in enumerate(((x, "f32"), (v, "s32")))]
    (out,) = flatten(ev.run(module.entry, params)[0])
    perms = Permutations(ev)
    perms.run([out])
    found = perms.info(out)
    assert out.op == "slice" and (found is not None) is kept
    if kept:
        values = {0: x, 1: v}
        dense, perm = evaluate(found.dense, values, ev.values), evaluate(found.perm, values, ev.values)
        assert found.row == 0 and dense.shape == (8, 2)
        np.testing.assert_array_equal(np.take(dense, perm, axis=0), evaluate(out, values, ev.values))
