"""HLO -> terms (equivci/translate/) against XLA itself: small functions written in several styles
are lowered by JAX in-process, translated as a one-device reference, and the output terms'
values (terms/semantics.py) must equal what XLA computes for the same inputs.

A wrong op handler (a dropped operand, a dim off by one, an unsigned dtype misnamed) that the rule
checks cannot see (they relate terms to terms) changes a value here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from equivci.capture.types import LeafPlacement
from equivci.hlo.parser import parse_module
from equivci.layers.segments import program_order
from equivci.options import Budgets
from equivci.prove.programs import build_programs
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator
from equivci.translate.programs import flatten
from equivci.translate.unroll import Unroller

RNG = np.random.default_rng(3)
V, D, T = 16, 8, 6
TABLE = RNG.standard_normal((V, D)).astype(np.float32)
X = RNG.standard_normal((T, D)).astype(np.float32)
IDS = RNG.integers(0, V, (T,)).astype(np.int32)
IDS[:2] = [0, V - 1]  # both ends of the range


def _embed_u32(table, ids):  # token ids as uint32 over their whole range [0, V)
    return table[ids]


def _take_one_hot(table, ids):
    return jax.nn.one_hot(ids, V, dtype=table.dtype) @ table


def _softmax_norm(x):
    y = jax.nn.softmax(x, axis=-1)
    mean = y.mean(-1, keepdims=True)
    return (y - mean) * lax.rsqrt(((y - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def _reductions(x):
    return jnp.max(x, axis=0), jnp.min(x, axis=-1), x.prod(axis=1), (x > 0).all(axis=0)


def _top_k(x):
    values, indices = lax.top_k(x, 3)
    return values, indices


def _scatter_add(x, ids):
    return jnp.zeros((V, D), x.dtype).at[ids].add(x)


def _picked_and_its_gradient(logits, ids):  # the gradient of take_along_axis scatters one value per row
    def picked(z):
        return jnp.take_along_axis(z, ids[:, None], axis=1)[:, 0]

    return picked(logits), jax.grad(lambda z: (picked(z) * jnp.arange(T, dtype=z.dtype)).sum())(logits)


def _causal_mask(x):
    scores = x @ x.T
    row, col = lax.broadcasted_iota(jnp.int32, scores.shape, 0), lax.broadcasted_iota(jnp.int32, scores.shape, 1)
    return jnp.where(col <= row, scores, -1e9).sum(-1)


def _layouts(x):
    heads = x.reshape(T, 2, D // 2).transpose(1, 0, 2)
    stretched = lax.broadcast_in_dim(x[:, :1], (T, 3), (0, 1))  # a size-1 dim stretched in place
    return jnp.concatenate([heads[1], heads[0][:, ::2], jnp.repeat(x[:, :1], 2, axis=1), stretched], axis=-1)


def _padded(x):  # rows added on both sides, a column cut (a negative amount) and three added
    return lax.pad(x, np.float32(0.5), [(1, 2, 0), (-1, 3, 0)]), jnp.pad(x, ((0, 1), (2, 0)))


def _dynamic_window(x, ids):
    start = ids[0] % (T - 1)
    return lax.dynamic_slice_in_dim(x, start, 2, axis=0), lax.dynamic_update_slice_in_dim(x, x[:1] * 2, start, 0)


def _offset_windows(table, start):  # translate/offsets.py: `start` is a valid start of 8 rows, [0, 8]
    return (
        lax.dynamic_slice_in_dim(table, start, 8),
        lax.dynamic_slice_in_dim(table, start + 4, 4),
        lax.dynamic_slice(table, (2 * 3 + start - 6 + 7, 1), (1, 3)),
        jnp.take(table, start + 2 + jnp.arange(5), axis=0),
    )


def _set_at(x, pos):  # translate/index_writes.py: a row and a column overwritten at an index input
    return x.at[pos].set(x[0] * 2), x.at[:, pos].set(x[:, 1] + 1)


def _complex_rotation(x):  # translate/complex_pairs.py: complex values as pairs of real ones
    z = lax.complex(x[:, 0::2], x[:, 1::2])
    rot = jnp.exp(1j * (jnp.arange(T, dtype=jnp.float32)[:, None] * jnp.linspace(0.1, 1.0, D // 2)))
    w = (z * rot + z) - rot.astype(jnp.complex64) * 2.0
    paired = jnp.stack([w.real, jnp.imag(w)], axis=-1).reshape(x.shape)
    return paired, jnp.real(z @ jnp.swapaxes(z, 0, 1)), -w[1:, :2].T


def _integer_mix(ids):
    shifted = jnp.clip(ids * 3 - 7, 0, V - 1)
    return (shifted // 2 + (shifted % 3)).astype(jnp.int32), (ids > 4) & (ids < 12)


def _folded_constants(x):  # computed from iotas and literals only: the translation folds them
    steps = lax.iota(jnp.float32, D) - 3
    rows, cols = lax.broadcasted_iota(jnp.int32, x.shape, 0), lax.broadcasted_iota(jnp.int32, x.shape, 1)
    some = ((rows * cols) % 5 == 1).any(axis=1)  # a mask reduced along one dim, not all
    every = ((rows + cols) % 7 != 3).all(axis=0)
    clamped = lax.clamp(np.float32(-1.5), steps, np.float32(2.0))
    return x + clamped + jnp.where(steps > 0, steps, -2 * steps) + jnp.where(some[:, None] & every, 1.0, 0.0)


def _sorted_group_ids(table, ids):  # translate/group_ids.py: each sorted row's group from the group sizes
    counts = jnp.bincount(ids, length=V)
    marks = jnp.zeros(T, jnp.int32).at[jnp.cumsum(counts)].add(1)
    group = jnp.repeat(jnp.arange(V), counts, total_repeat_length=T)
    return group, jnp.cumsum(marks), jnp.arange(V)[ids], table[ids][jnp.argsort(ids)] * group[:, None]


def _group_marks_written_otherwise(table, ids):  # the starts as [0, ends[:-1]]; marks of another dtype than the ids
    counts = jnp.bincount(ids, length=V)
    ends = jnp.cumsum(counts)
    at_starts = jnp.zeros(T, jnp.int32).at[jnp.concatenate([jnp.zeros(1, ends.dtype), ends[:-1]])].add(1)
    at_ends = jnp.zeros(T, jnp.int16).at[ends].add(jnp.int16(1))
    group = jnp.repeat(jnp.arange(V), counts, total_repeat_length=T)
    return jnp.cumsum(at_starts), jnp.cumsum(at_ends), table[ids][jnp.argsort(ids)] * group[:, None]


def _top_k_combine(x):  # translate/one_hots.py: a row's top-k columns are distinct, so set = sum
    values, idx = lax.top_k(jax.nn.softmax(x), 3)
    return jnp.zeros((T, D), x.dtype).at[jnp.arange(T)[:, None], idx].set(values * 2.0)


def _argsort_columns_transposed(x):  # operand [column, row]; the columns a slice of an argsort
    idx = jnp.argsort((x * 4).astype(jnp.int32), axis=-1, stable=True)[:, 2:5]
    return jnp.zeros((D, T), x.dtype).at[idx, jnp.arange(T)[:, None]].set(x[:, :3])


def _vmapped_top_k_combine(x):  # the scatter's rows as a batching dim of operand and indices
    values, idx = lax.top_k(x, 3)
    return jax.vmap(lambda v, i: jnp.zeros(D, x.dtype).at[i].set(v))(values, idx)


def _columns_added(x, ids):  # an add needs no distinct columns; ids past the dim are skipped
    cols = jnp.stack([ids % D, (ids + 3) % D, ids], axis=1)
    return jnp.ones((T, D), x.dtype).at[jnp.arange(T)[:, None], cols].add(x[:, :3])


def _picked_sum_gradient(logits, ids):  # a scatter-add of the same number at one column per row
    return logits + jax.grad(lambda z: 2.0 * jnp.take_along_axis(z, ids[:, None], axis=1).sum())(logits)


def _writes_at_constant_rows(x):  # scatters at constant indices: a row, two rows, a column
    return x.at[2].set(x[0] * 2), x.at[jnp.array([1, 4])].set(x[:2] + 1), x.at[:, 3].set(x[:, 0])


def _updates_at_constant_starts(x):  # XLA clamps a start that would put the update past the end
    return lax.dynamic_update_slice(x, x[:2, :3] * 2, (1, 2)), lax.dynamic_update_slice(x, x[:2, :3] + 1, (T - 1, 100))


def _online_softmax(x):  # translate/shifts.py: blocks of keys in rotated order, rescaled to the running max
    s = x @ TABLE.T
    m, acc, den = jnp.full(T, -jnp.inf), jnp.zeros((T, D)), jnp.zeros(T)
    for b in (2, 0, 3, 1):
        block = s[:, 4 * b : 4 * b + 4]
        new = jnp.maximum(m, block.max(-1))
        p, alpha = jnp.exp(block - new[:, None]), jnp.exp(m - new)
        acc, den, m = acc * alpha[:, None] + p @ TABLE[4 * b : 4 * b + 4], den * alpha + p.sum(-1), new
    return acc / den[:, None], den, m


def _reduced_pieces(x):  # sums and maxima over the concat dim, identity pieces dropped; over a kept dim
    rows = jnp.arange(T)[:, None]
    both = jnp.concatenate([x[:2], x[3:5] * 2], axis=0)
    return (
        jnp.sum(jnp.where(rows < 3, x, 0.0), axis=0),
        jnp.max(jnp.where(rows >= 2, x, -jnp.inf), axis=0),
        jnp.sum(jnp.concatenate([both, jnp.ones((2, D))], axis=0), axis=0),
        jnp.min(jnp.concatenate([x[:, :3], x[:, 5:]], axis=1), axis=1),
        jnp.sum(both, axis=1),
        jnp.sum(jnp.where(rows < 0, x, 0.0), axis=0) + x[0],
        jnp.sum(jnp.full((3, D), 2.0), axis=0) + x[1],
    )


def _reduced_with_unit_dims(x):  # size-1 dims among the reduced ones: the others' reduction, reshaped
    heads = x.reshape(1, T, 1, 2, D // 2)  # GQA's one KV head of a device, its group of 2 query heads
    return (
        heads.sum(axis=(0, 2, 3)),
        heads.max(axis=(0, 1, 2, 4)),
        heads.prod(axis=(2, 3, 4)),
        jnp.min(x[:, None, :, None], axis=(0, 1, 3)),
    )


def _loop_of_three_trips(x):  # a while loop with a constant trip count (jax.lax.fori_loop)
    x = jnp.asarray(x)
    return lax.fori_loop(0, 3, lambda i, c: c * 2 + x[i], x)


CASES = {
    "folded clamp, select, any, all": (_folded_constants, (X,)),
    "embedding with uint32 ids": (_embed_u32, (TABLE, IDS.astype(np.uint32))),
    "embedding by one-hot matmul": (_take_one_hot, (TABLE, IDS)),
    "softmax and normalization": (_softmax_norm, (X,)),
    "online softmax over blocks in rotated order": (_online_softmax, (X,)),
    "max, min, product, all": (_reductions, (X,)),
    "top-k": (_top_k, (X,)),
    "scatter-add of rows": (_scatter_add, (X, IDS)),
    "take_along_axis and its gradient": (
        _picked_and_its_gradient,
        (RNG.standard_normal((T, V)).astype(np.float32), IDS),
    ),
    "causal mask from iotas": (_causal_mask, (X,)),
    "heads, strides, concat, repeat": (_layouts, (X,)),
    "dynamic slice and update": (_dynamic_window, (X, IDS)),
    "writes at constant rows and columns": (_writes_at_constant_rows, (X,)),
    "updates at constant starts, one clamped": (_updates_at_constant_starts, (X,)),
    "a vmapped lookup over a batch of one": (lambda t, i: jax.vmap(lambda t, i: t[i])(t[None], i[None]), (TABLE, IDS)),
    "an iota gathered at ids or -1": (
        lambda table, ids: (
            table[ids],
            jnp.arange(V).at[jnp.where(ids > 3, ids, -1)].get(mode="promise_in_bounds", wrap_negative_indices=False),
        ),
        (TABLE, IDS),
    ),
    "a select by a constant mask of one row": (lambda x: jnp.where(jnp.arange(D)[None, :] < 5, x[:1], -x[1:2]), (X,)),
    "a clamp of an input": (lambda x: lax.clamp(np.float32(-0.5), x, np.float32(0.5)), (X,)),
    "a scatter-add of one number per row": (
        _picked_sum_gradient,
        (RNG.standard_normal((T, V)).astype(np.float32), IDS),
    ),
    "pad and cut": (_padded, (X,)),
    "integer arithmetic and masks": (_integer_mix, (IDS,)),
    "sorted group ids (jnp.repeat of the group sizes)": (_sorted_group_ids, (TABLE, IDS)),
    "sorted group ids from the starts as [0, ends[:-1]], marks in int16": (
        _group_marks_written_otherwise,
        (TABLE, IDS),
    ),
    "top-k weights set per row (one-hot sum)": (_top_k_combine, (X,)),
    "argsort columns set, expert-major": (_argsort_columns_transposed, (X,)),
    "columns added per row, repeats allowed": (_columns_added, (X, IDS)),
    "top-k weights set per token under vmap (batching dims)": (_vmapped_top_k_combine, (X,)),
    "complex rotation, product, dot and layout as real pairs": (_complex_rotation, (X,)),
    **{f"windows at offsets from a slice start {s}": (_offset_windows, (TABLE, np.int32(s))) for s in (0, 3, 8)},
    "reductions over concatenations, identity pieces among them": (_reduced_pieces, (X,)),
    **{f"a row and a column set at index {s}": (_set_at, (X, np.int32(s))) for s in (0, 2, T - 1)},
}


def _leaf(path: str, value) -> LeafPlacement:
    value = np.asarray(value)
    return LeafPlacement(path, value.shape, str(value.dtype), (tuple((0, n) for n in value.shape),))


@pytest.mark.parametrize("case", sorted(CASES))
def test_translated_terms_compute_what_xla_computes(case):
    _assert_xla_values(*CASES[case])


def test_a_reduce_over_size_1_dims_among_others_computes_what_xla_computes():
    """Built as the reduction over the other dims, reshaped (reductions.reduce_term)."""
    _assert_xla_values(_reduced_with_unit_dims, (X,))


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, jnp.bfloat16, np.int32, np.uint32, np.int8, np.uint8, np.bool_]
)
def test_each_input_is_a_term_of_its_hlo_dtype(dtype):
    x = np.zeros((2, 3), dtype)
    module = parse_module(jax.jit(lambda v: v).lower(x).as_text(dialect="hlo"))
    (param,) = [i for i in module.entry.instructions if i.opcode == "parameter"]
    leaf = (_leaf("[0]", x),)
    (out,) = build_programs(module, module, leaf, leaf, 1).reference_outputs
    assert out.op == "param" and out.dtype == param.shape.dtype


def test_a_reduce_of_two_operands_from_a_start_it_is_given_stays_opaque():
    """Only constant starts are read (argmax's); a start the caller passes leaves the reduce an opaque
    term of its own shape in both outputs, a value nothing is claimed of."""

    def fn(x, y, start):
        return lax.reduce((x, y), (start, start), lambda a, b: (jnp.maximum(a[0], b[0]), a[1] + b[1]), (1,))

    args = (X, X * 2, np.float32(0.5))
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))
    leaves = tuple(_leaf(f"[{k}]", a) for k, a in enumerate(args))
    outs = (_leaf("[0]", X[:, 0]), _leaf("[1]", X[:, 0]))
    for out in build_programs(module, module, leaves, outs, 1).reference_outputs:
        assert out.shape == (T,) and "opaque" in _ops(out)


def test_a_top_k_past_the_fold_budget_computes_what_xla_computes():
    """Its index lanes are then an iota term, not a folded constant."""
    _assert_xla_values(_top_k, (X,), Budgets(fold_elements=1))


def _translated(fn, args, budgets: Budgets = Budgets()):
    """The one-device translation of fn on args, and what XLA computes."""
    hlo = jax.jit(fn).lower(*args).as_text(dialect="hlo", debug_info=True)
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    module = parse_module(hlo)
    inputs = tuple(_leaf(f"[{k}]", a) for k, a in enumerate(args))
    outputs = tuple(_leaf(f"[{k}]", w) for k, w in enumerate(want))
    return build_programs(module, module, inputs, outputs, 1, budgets=budgets), want


def _assert_xla_values(fn, args, budgets: Budgets = Budgets()) -> None:
    programs, want = _translated(fn, args, budgets)
    params = {k: np.asarray(a) for k, a in enumerate(args)}
    assert len(programs.reference_outputs) == len(want)
    for term, expected in zip(programs.reference_outputs, want):
        assert "opaque" not in _ops(term), "an op of the case was not translated"
        got = evaluate(term, params, programs.evaluator.values)
        expected = np.asarray(expected)
        assert got.shape == expected.shape and got.dtype == expected.dtype, (got.dtype, expected.dtype)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _ops(term) -> set[str]:
    return {t.op for t in program_order([term])}


def _set_at(base, columns, x):
    return base.at[jnp.arange(T)[:, None], columns].set(x[:, : columns.shape[1]])


def _sorted_keys_set(x):  # the keys output of a sort of (keys, iota): repeats kept
    keys, lanes = lax.sort_key_val(jnp.argmax(x.reshape(T, 2, D // 2), -1), jnp.broadcast_to(jnp.arange(2), (T, 2)))
    return _set_at(jnp.zeros((T, D)), keys, x + lanes[:, :1])


OVERWRITES = {  # each could lose a write or keep part of the operand: not a sum of one-hots
    "a column repeated": lambda x: _set_at(jnp.zeros((T, D)), jnp.argmax(x, -1)[:, None].repeat(2, 1), x),
    "into ones": lambda x: _set_at(jnp.ones((T, D)), lax.top_k(x, 2)[1], x),
    "sorted keys, not their indices": lambda x: _sorted_keys_set(x),
    "two rows at one row": lambda x: (
        jnp.zeros((T, D)).at[jnp.arange(T)[:, None] // 2, lax.top_k(x, 2)[1]].set(x[:, :2])
    ),
}


@pytest.mark.parametrize("case", sorted(OVERWRITES))
def test_overwrites_that_could_lose_a_write_stay_opaque(case):
    """translate/one_hots.py's guards: the scatter stays opaque (the near misses' verdicts are in
    tests/soundness: a one-hot sum against such an overwrite is `mismatch`)."""
    programs, _ = _translated(OVERWRITES[case], (X,))
    assert "opaque" in _ops(programs.reference_outputs[0])


def test_a_loop_with_a_constant_trip_count_unrolls_to_what_xla_computes():
    """The evaluator hands a `while` to its loop handler (the reference's unroller): the loop's
    result is the body applied three times, with no opaque term left."""
    hlo = jax.jit(_loop_of_three_trips).lower(X).as_text(dialect="hlo")
    module = parse_module(hlo)
    ev = Evaluator(module, TermTable(), 1)
    ev.loop_handler = Unroller()
    (out,) = flatten(ev.run(module.entry, [[ev.table.make("param", (0,), (), X.shape, "f32")]])[0])
    assert "opaque" not in _ops(out) and len(ev.loops) == 1
    np.testing.assert_allclose(evaluate(out, {0: X}, ev.values), jax.jit(_loop_of_three_trips)(X), rtol=1e-5)


def test_a_loop_no_handler_takes_is_an_opaque_term_of_its_own_computations():
    """Without a loop handler (the handler declines a loop whose trip count is known only at run time)
    a `while` is an opaque term named by its body and condition: the same loop translated again is
    the same term (both programs meet there), a loop with another body is another term."""
    table = TermTable()

    def translated(factor: float):
        fn = lambda x: lax.while_loop(lambda c: c[1].sum() < 1e6, lambda c: (c[0] + 1, c[1] * factor), (0, x))[1]  # noqa: E731
        module = parse_module(jax.jit(fn).lower(X).as_text(dialect="hlo"))
        ev = Evaluator(module, table, 1)
        (out,) = flatten(ev.run(module.entry, [[table.make("param", (0,), (), X.shape, "f32")]])[0])
        assert len(ev.loops) == 1 and "opaque" in _ops(out) and out.shape == X.shape
        return out

    assert translated(2.0) is translated(2.0)
    assert translated(2.0) is not translated(3.0)


def test_both_programs_fold_constants_within_the_budget_they_are_given():
    """A budget of one folded element keeps an 8-element constant computation symbolic in the
    reference as in the distributed program (each evaluator gets the caller's budgets)."""
    x = X[0]
    hlo = jax.jit(lambda v: v + lax.iota(jnp.float32, D) * 2).lower(x).as_text(dialect="hlo")
    module = parse_module(hlo)
    leaf = (_leaf("[0]", x),)
    default = build_programs(module, module, leaf, leaf, 1)
    tight = build_programs(module, module, leaf, leaf, 1, budgets=Budgets(fold_elements=1))
    assert "iota" not in _ops(default.reference_outputs[0]) and "iota" not in _ops(default.device_outputs[0][0])
    assert "iota" in _ops(tight.reference_outputs[0]) and "iota" in _ops(tight.device_outputs[0][0])
    np.testing.assert_allclose(
        evaluate(tight.reference_outputs[0], {0: x}, tight.evaluator.values), x + np.arange(D) * 2
    )
