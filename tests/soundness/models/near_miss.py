"""Near-miss model pairs: each buggy distributed function differs from a correct one only where one
side condition of the verifier matters (a window end, a coverage test, a sign fact, a routing
clause, a divisibility guard). tests/soundness/near_miss.yaml pairs them with their references;
tests/soundness/test_near_misses.py says which verdict each must get, and
bench/verifier_mutants.py names the guard each one protects.

Shapes are tiny so that capture, proof and the numeric oracle take about a second each.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

F32 = jnp.float32
TP = "tp"
V, D, B, S = 8, 4, 2, 4  # vocabulary, width, batch, sequence


def spec(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


# --- vocabulary-parallel lookups: range masks (equivci/verify masks) -----------------------------
def embed(table, ids):
    return table[ids]


def embed_inputs():
    return (spec(V, D), spec(B, S, dtype=jnp.int32))


def _vocab_parallel(table, ids, mesh, window, shift=None, mask_of=None):
    """Megatron's lookup; `window(lo, n)` gives the (mask, lookup-mask) of a shard."""

    def body(table, ids):
        n = table.shape[0]
        lo = lax.axis_index(TP) * n
        mine, lookup = window(ids, lo, n)
        local_ids = jnp.where(lookup, ids - (lo if shift is None else shift(lo)), 0)
        rows = table[local_ids]
        mask = mine if mask_of is None else mask_of(mine)
        return lax.psum(rows * mask[..., None], TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P())(table, ids)


def _same(mine):
    return mine, mine


def embed_ge_lt(table, ids, *, mesh):
    return _vocab_parallel(table, ids, mesh, lambda i, lo, n: _same((i >= lo) & (i < lo + n)))


def embed_gt_le(table, ids, *, mesh):
    """The same windows written with > and <=: correct."""
    return _vocab_parallel(table, ids, mesh, lambda i, lo, n: _same((i > lo - 1) & (i <= lo + n - 1)))


def embed_gt_drops_first(table, ids, *, mesh):
    # BUG: `>` leaves out the shard's first id (the offset of a strict test)
    return _vocab_parallel(table, ids, mesh, lambda i, lo, n: _same((i > lo) & (i < lo + n)))


def embed_le_claims_next(table, ids, *, mesh):
    # BUG: `<=` also claims the next shard's first id
    return _vocab_parallel(table, ids, mesh, lambda i, lo, n: _same((i >= lo) & (i <= lo + n)))


def embed_lt_short(table, ids, *, mesh):
    # BUG: every shard misses its last id (a gap between windows)
    return _vocab_parallel(table, ids, mesh, lambda i, lo, n: _same((i >= lo) & (i < lo + n - 1)))


def embed_ge_late(table, ids, *, mesh):
    # BUG: `>=` one too late: every shard misses its first id
    return _vocab_parallel(table, ids, mesh, lambda i, lo, n: _same((i >= lo + 1) & (i < lo + n)))


def embed_last_shard_short(table, ids, *, mesh):
    # BUG: only the last shard misses its last id (the windows stop one short of the vocabulary)
    def window(i, lo, n):
        last = lax.axis_index(TP) == lax.axis_size(TP) - 1
        return _same((i >= lo) & (i < lo + n - jnp.where(last, 1, 0)))

    return _vocab_parallel(table, ids, mesh, window)


def embed_first_shard_short(table, ids, *, mesh):
    # BUG: only the first shard misses its last id (a gap between two windows)
    def window(i, lo, n):
        first = lax.axis_index(TP) == 0
        return _same((i >= lo) & (i < lo + n - jnp.where(first, 1, 0)))

    return _vocab_parallel(table, ids, mesh, window)


def embed_overlapping_windows(table, ids, *, mesh):
    # BUG: shard 0's window also holds id 4, which shard 1 holds too: its row is counted twice
    def body(table, ids):
        n = V // 2
        lo = lax.axis_index(TP) * n
        start = jnp.minimum(lo, V - n - 1)  # a window of n + 1 rows inside the table
        window = lax.dynamic_slice_in_dim(table, start, n + 1)
        mine = (ids >= lo) & (ids < lo + n + 1)
        rows = window[jnp.where(mine, ids - start, 0)]
        return lax.psum(rows * mine[..., None], TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P())(table, ids)


def embed_shift_off(table, ids, *, mesh):
    # BUG: the local index is ids - (lo - 1): each id reads the next row of its shard
    return _vocab_parallel(table, ids, mesh, lambda i, lo, n: _same((i >= lo) & (i < lo + n)),
                           shift=lambda lo: lo - 1)


def embed_lookup_narrower(table, ids, *, mesh):
    # BUG: the lookup masks the shard's last id to row 0, the output mask keeps it
    return _vocab_parallel(table, ids, mesh,
                           lambda i, lo, n: ((i >= lo) & (i < lo + n), (i >= lo) & (i < lo + n - 1)))


def embed_mask_transposed(table, ids, *, mesh):
    # BUG: the output mask is the shard's mask at the transposed positions
    def body(table, ids):
        n = table.shape[0]
        lo = lax.axis_index(TP) * n
        mine = (ids >= lo) & (ids < lo + n)
        rows = table[jnp.where(mine, ids - lo, 0)]  # (S, S, D)
        return lax.psum(rows * mine.T[..., None], TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P())(table, ids)


def square_embed_inputs():
    return (spec(V, D), spec(S, S, dtype=jnp.int32))


# --- comparisons the index bounds decide (ids are valid indices of the table: [0, V - 1]) -------
def embed_guard_lt(table, ids, *, mesh):
    # BUG: the last id is zeroed (ids < V - 1 is not always true)
    return jnp.where((ids < V - 1)[..., None], table[ids], 0.0)


def embed_guard_le(table, ids, *, mesh):
    # BUG: ids <= V - 2 is not always true
    return jnp.where((ids <= V - 2)[..., None], table[ids], 0.0)


def embed_guard_ge(table, ids, *, mesh):
    # BUG: id 0 is zeroed (ids >= 1 is not always true)
    return jnp.where((ids >= 1)[..., None], table[ids], 0.0)


def embed_guard_gt(table, ids, *, mesh):
    # BUG: ids > 0 is not always true
    return jnp.where((ids > 0)[..., None], table[ids], 0.0)


def embed_guard_ne(table, ids, *, mesh):
    # BUG: ids != 0 is not always true
    return jnp.where((ids != 0)[..., None], table[ids], 0.0)


def embed_guard_eq(table, ids, *, mesh):
    # BUG: ids == 0 is not always false: zero where it holds
    return jnp.where((ids == 0)[..., None], 0.0, table[ids])


def embed_guard_ne_top(table, ids, *, mesh):
    # BUG: ids != V - 1 is not always true (the largest id)
    return jnp.where((ids != V - 1)[..., None], table[ids], 0.0)


def embed_guard_eq_top(table, ids, *, mesh):
    # BUG: ids == V - 1 is not always false
    return jnp.where((ids == V - 1)[..., None], 0.0, table[ids])


def embed_guard_always(table, ids, *, mesh):
    """Comparisons the bounds decide: always true, never true (correct)."""
    keep = (ids < V) & (ids >= 0) & (ids <= V - 1) & (ids > -1) & (ids != V)
    return jnp.where((keep & ~(ids == V))[..., None], table[ids], 0.0)


# --- elementwise side conditions ----------------------------------------------------------------
def pos(x, y):
    return jnp.exp(x) + y


def abs_of_sum(x, y, *, mesh):
    # BUG: |exp(x) + y| is not exp(x) + y (y can be negative)
    return jnp.abs(jnp.exp(x) + y)


def pos_sq(x, y):
    return jnp.exp(x) * jnp.exp(y) + jnp.maximum(jnp.exp(x), jnp.exp(y))


def abs_of_positive(x, y, *, mesh):
    """abs of a value that is non-negative by its form is dropped (correct)."""
    return jnp.abs(jnp.exp(x) * jnp.exp(y) + jnp.maximum(jnp.exp(x), jnp.exp(y)))


def neg_exp(x, y):
    return -jnp.exp(x)


def abs_of_negated(x, y, *, mesh):
    # BUG: |-exp(x)| is not -exp(x)
    return jnp.abs(-jnp.exp(x))


def diff_exp(x, y):
    return jnp.exp(x) - jnp.exp(y)


def abs_of_difference(x, y, *, mesh):
    # BUG: a difference of exponentials can be negative
    return jnp.abs(jnp.exp(x) - jnp.exp(y))


def min_exp(x, y):
    return jnp.minimum(jnp.exp(x), y)


def abs_of_minimum(x, y, *, mesh):
    # BUG: min(exp(x), y) can be negative
    return jnp.abs(jnp.minimum(jnp.exp(x), y))


def xy_inputs():
    return (spec(4, 4), spec(4, 4))


def ident(x, y):
    return x


def max_with_inf(x, y, *, mesh):
    # BUG: max(x, +inf) is +inf, not x (only max(x, -inf) is x)
    return jnp.maximum(x, jnp.inf)


def min_with_neg_inf(x, y, *, mesh):
    # BUG: min(x, -inf) is -inf
    return jnp.minimum(x, -jnp.inf)


def guards_kept(x, y, *, mesh):
    """max(x, -inf) and min(x, inf) are x (correct)."""
    return jnp.minimum(jnp.maximum(x, -jnp.inf), jnp.inf)


def finite_of_other(x, y, *, mesh):
    # BUG: where(isfinite(y), x, 0) is not x: the test is of another value
    return jnp.where(jnp.isfinite(y), x, 0.0)


def finite_guard(x, y, *, mesh):
    """where(isfinite(x), x, 0) is x over the reals (logsumexp's guard; correct)."""
    return jnp.where(jnp.isfinite(x), x, 0.0)


def select_by_not(x, y, *, mesh):
    # BUG: another unary predicate than isfinite(x): where(~(x > 0), x, 0) is min(x, 0)
    return jnp.where(~(x > 0), x, 0.0)


def select_by_iota(x, y, *, mesh):
    # BUG: a constant predicate that is not the same everywhere picks both branches
    return jnp.where(jnp.arange(4)[:, None] < 2, x, y)


def reduce_from_one(x, y, *, mesh):
    # BUG: a sum that starts at 1
    return jnp.zeros_like(x) + lax.reduce(x, 1.0, lax.add, (1,))[:, None]


def row_sum(x, y):
    return jnp.zeros_like(x) + jnp.sum(x, axis=1)[:, None]


def twice_sum(x, y):
    return 2.0 * (x + y)


def twice_one(x, y, *, mesh):
    # BUG: 2x + y is not 2(x + y): only equal factors come out of a sum
    return 2.0 * x + y


def twice(x, y):
    return x * 2.0


def halved(x, y, *, mesh):
    # BUG: x / 2 is not 2x
    return x / 2.0


def nudged(x, y, *, mesh):
    # BUG: 1 % too large everywhere (far above float32 rounding)
    return x * 1.01


def slice_of_slice_ref(x, y):
    return lax.slice(x, (1, 0), (3, 4))


def slice_of_slice(x, y, *, mesh):
    # BUG: rows [1, 3) of rows [2, 6) are rows [3, 5), not [1, 3)
    return lax.slice(lax.slice(x, (2, 0), (6, 4)), (1, 0), (3, 4))


def rows_inputs():
    return (spec(6, 4), spec(6, 4))


# --- reshapes of slices (the divisibility guards) ------------------------------------------------
def reshape_then_rows(x):
    return x.reshape(3, 4)[0:2]


def rows_then_reshape(x, *, mesh):
    # BUG: elements [2, 10) are not rows [0, 2) of the (3, 4) view: 2 is not a multiple of 4
    return x[2:10].reshape(2, 4)


def flat_inputs():
    return (spec(12),)


def first_row_flat(x):
    return x[0:1].reshape(4)


def flat_window(x, *, mesh):
    # BUG: elements [2, 6) of the flat view are not row 0: 2 is not a multiple of 4
    return x.reshape(12)[2:6]


def grid_inputs():
    return (spec(3, 4),)


# --- concatenations -----------------------------------------------------------------------------
def concat_ref(x, y):
    return jnp.concatenate([x, y], axis=0)[2:6]


def concat_straddle(x, y, *, mesh):
    """Rows [2, 6) of [x; y] straddle the seam (correct)."""
    return jnp.concatenate([x[2:4], y[0:2]], axis=0)


def concat_straddle_wrong(x, y, *, mesh):
    # BUG: the part from y starts one row late
    return jnp.concatenate([x[2:4], y[1:3]], axis=0)


def concat_left_only(x, y, *, mesh):
    # BUG: all four rows taken from x (clamped past its end)
    return jnp.concatenate([x[2:4], x[2:4]], axis=0)


def concat_other_tail(x, y, *, mesh):
    # BUG: the rows from y are doubled (rows [2, 6) reach past x: they are not a slice of x)
    return jnp.concatenate([x, 2.0 * y], axis=0)[2:6]


def cat_inputs():
    return (spec(4, 3), spec(4, 3))


# --- collectives --------------------------------------------------------------------------------
def identity(x):
    return x


def ppermute_self_only(x, *, mesh):
    # BUG: device 1 has no source: it receives zeros, not its own shard
    f = lambda v: lax.ppermute(v, TP, perm=[(0, 0)])  # noqa: E731 (the body shard_map runs, kept on one line)
    return jax.shard_map(f, mesh=mesh, in_specs=P(TP), out_specs=P(TP))(x)


def vec_inputs():
    return (spec(4, 2),)


def row_min(x):
    return jnp.min(x, axis=1)


def pmax_of_min(x, *, mesh):
    # BUG: the max over shards of the shards' minima is not the minimum
    f = lambda v: lax.pmax(jnp.min(v, axis=1), TP)  # noqa: E731 (the body shard_map runs, kept on one line)
    return jax.shard_map(f, mesh=mesh, in_specs=P(None, TP), out_specs=P())(x)


def row_max(x):
    return jnp.max(x, axis=1)


def pmax_of_max(x, *, mesh):
    """A max of the shards' maxima (correct)."""
    f = lambda v: lax.pmax(jnp.max(v, axis=1), TP)  # noqa: E731 (the body shard_map runs, kept on one line)
    return jax.shard_map(f, mesh=mesh, in_specs=P(None, TP), out_specs=P())(x)


def pmax_drops_last_column(x, *, mesh):
    # BUG: each shard leaves out its last column
    f = lambda v: lax.pmax(jnp.max(v[:, :-1], axis=1), TP)  # noqa: E731 (the body shard_map runs, kept on one line)
    return jax.shard_map(f, mesh=mesh, in_specs=P(None, TP), out_specs=P())(x)


def pmax_first_shard_short(x, *, mesh):
    # BUG: the first shard leaves out its last column (a gap between two windows)
    def f(v):
        first = lax.axis_index(TP) == 0
        return lax.pmax(jnp.where(first, jnp.max(v[:, :-1], axis=1), jnp.max(v, axis=1)), TP)

    return jax.shard_map(f, mesh=mesh, in_specs=P(None, TP), out_specs=P())(x)


def wide_inputs():
    return (spec(3, 8),)


# --- expert parallelism (routing) ---------------------------------------------------------------
T, E, F = 8, 2, 4  # tokens, experts (one per device), hidden


def _expert(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def moe(x, w_router, w1, w2):
    choice = jnp.argmax(x @ w_router, axis=-1)
    outs = jax.vmap(_expert, in_axes=(None, 0, 0))(x, w1, w2)  # (E, T, D)
    return jnp.take_along_axis(outs, choice[None, :, None], axis=0)[0]


def moe_inputs():
    return (spec(T, D), spec(D, E), spec(E, D, F), spec(E, F, D))


def _slots(choice, n_experts, shared=False):
    onehot = jax.nn.one_hot(choice, n_experts, dtype=jnp.int32)
    slot = jnp.cumsum(onehot, axis=0) * onehot - 1
    if shared:
        slot = jnp.where(slot >= 0, slot // 2, -1)
    return onehot, slot


def _dispatch(choice, n_experts, shared=False):
    onehot, slot = _slots(choice, n_experts, shared)
    return jax.nn.one_hot(slot, choice.shape[0], dtype=F32) * onehot[..., None]


def _moe_ep(x, w_router, w1, w2, mesh, *, shared=False, wrong_expert=False, rotate=False, back=True):
    n_experts = w_router.shape[1]

    def body(x, w_router, w1, w2):
        choice = jnp.argmax(x @ w_router, axis=-1)
        # rotate: every token goes to the expert after the one it chose (a valid dispatch of other experts)
        dispatch = _dispatch((choice + 1) % n_experts if rotate else choice, n_experts, shared)  # (T_l, E, C)
        buffers = jnp.einsum("tec,td->ecd", dispatch, x)
        received = lax.all_to_all(buffers, TP, split_axis=0, concat_axis=0, tiled=True)
        y = _expert(received, w1[0], w2[0])  # this device's expert (expert 0 when replicated)
        if back:
            y = lax.all_to_all(y, TP, split_axis=0, concat_axis=0, tiled=True)
        return jnp.einsum("tec,ecd->td", dispatch, y)

    specs = (P(TP), P(), P(None) if wrong_expert else P(TP), P(None) if wrong_expert else P(TP))
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(TP))(x, w_router, w1, w2)


def moe_ep(x, w_router, w1, w2, *, mesh):
    return _moe_ep(x, w_router, w1, w2, mesh)


def moe_ep_shared_slot(x, w_router, w1, w2, *, mesh):
    # BUG: two tokens of an expert share one slot: the expert sees their sum
    return _moe_ep(x, w_router, w1, w2, mesh, shared=True)


def moe_ep_rotated_expert(x, w_router, w1, w2, *, mesh):
    # BUG: each token is sent to the next expert, not the one it chose
    return _moe_ep(x, w_router, w1, w2, mesh, rotate=True)


def moe_ep_expert_zero_everywhere(x, w_router, w1, w2, *, mesh):
    # BUG: the weights are replicated and every device runs expert 0
    return _moe_ep(x, w_router, w1, w2, mesh, wrong_expert=True)


def moe_ep_no_return(x, w_router, w1, w2, *, mesh):
    # BUG: combines without the return all_to_all: rows hold other devices' tokens
    return _moe_ep(x, w_router, w1, w2, mesh, back=False)


T_BIG = 32  # 16 tokens per device: 2 ** 16 index vectors, past the routing lemma's enumeration


def moe_big_inputs():
    return (spec(T_BIG, D), spec(D, E), spec(E, D, F), spec(E, F, D))


# --- precomputed tables: a device's rows of a longer constant table (translate/constants.py) -----
# The reference folds its rows into a [1, s, 1, d] constant; a device slices a [64, d] table at its
# positions. Over a 2-D mesh (positions x heads) the attention scores of the rotated q and k are
# proved through windows the numeric values propose (equivci/prove/candidates.py).
ROPE_LEN, ROPE_S, ROPE_H, ROPE_HD = 64, 8, 4, 4


def _rope_table(fn):
    import numpy as np

    inv = 1.0 / 10_000.0 ** (np.arange(0, ROPE_HD, 2) / ROPE_HD)
    return fn(np.outer(np.arange(ROPE_LEN), inv)).astype(np.float32)


def _rotate(q, cos, sin):
    q1, q2 = jnp.split(q, 2, axis=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([q1 * cos - q2 * sin, q1 * sin + q2 * cos], axis=-1)


def _rope_scores(x, wq, wk, q_rows, k_rows, gather=lambda k: k):
    q = _rotate(jnp.einsum("bsd,dhk->bshk", x, wq), *q_rows)
    k = gather(_rotate(jnp.einsum("bsd,dhk->bshk", x, wk), *k_rows))
    return jnp.einsum("bqhk,bthk->bhqt", q, k)


def rope_table(x, wq, wk):
    import numpy as np

    rows = (_rope_table(np.cos)[:ROPE_S], _rope_table(np.sin)[:ROPE_S])
    return _rope_scores(x, wq, wk, rows, rows)


def rope_table_inputs():
    return (spec(B, ROPE_S, D), spec(D, ROPE_H, ROPE_HD), spec(D, ROPE_H, ROPE_HD))


def _rope_table_sp_tp(x, wq, wk, mesh, shift):
    import numpy as np

    def body(x, wq, wk):
        def rows(start):
            return tuple(lax.dynamic_slice_in_dim(jnp.asarray(_rope_table(fn)), start, x.shape[1])
                         for fn in (np.cos, np.sin))

        start = lax.axis_index("sp") * x.shape[1]
        return _rope_scores(x, wq, wk, rows(start + shift), rows(start),
                            lambda k: lax.all_gather(k, "sp", axis=1, tiled=True))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sp"), P(None, TP), P(None, TP)),
                         out_specs=P(None, TP, "sp"))(x, wq, wk)


def rope_table_sp_tp(x, wq, wk, *, mesh):
    return _rope_table_sp_tp(x, wq, wk, mesh, 0)


def rope_table_sp_tp_shifted(x, wq, wk, *, mesh):
    # BUG: q takes the table's rows one position later than its tokens (k the right ones)
    return _rope_table_sp_tp(x, wq, wk, mesh, 1)


# --- strided slices (interleaved RoPE's x[..., ::2]): windows of x with the dim split by the step --
def _interleaved(x, first=0):
    rot = jnp.stack([-x[..., 1 - first::2], x[..., first::2]], axis=-1).reshape(x.shape)
    return x * 0.5 + rot


def interleaved(x, wq, wk):
    return _interleaved(jnp.einsum("bsd,dhk->bshk", x, wq))


def _interleaved_tp(x, wq, mesh, first):
    return jax.shard_map(lambda x, wq: _interleaved(jnp.einsum("bsd,dhk->bshk", x, wq), first), mesh=mesh,
                         in_specs=(P(), P(None, TP)), out_specs=P(None, None, TP))(x, wq)


def interleaved_tp(x, wq, wk, *, mesh):
    return _interleaved_tp(x, wq, mesh, 0)


def interleaved_tp_odd_first(x, wq, wk, *, mesh):
    # BUG: the even and odd elements of each pair trade places
    return _interleaved_tp(x, wq, mesh, 1)


# --- sorts along one dim (top-k routing): lanes of other dims are sorted on their own -------------
TOK, EXP, TOPK = 8, 4, 2


def topk_route(x, w_router):
    """Renormalized top-k routing weights [tokens, experts] (zero off the chosen experts)."""
    probs = jax.nn.softmax(x @ w_router, axis=-1)
    top_p, top_i = lax.top_k(probs, TOPK)
    top_p = top_p / top_p.sum(-1, keepdims=True)
    return jnp.einsum("tk,tke->te", top_p, jax.nn.one_hot(top_i, probs.shape[-1]))


def topk_inputs():
    return (spec(TOK, D), spec(D, EXP))


def topk_route_tokens(x, w_router, *, mesh):
    """Tokens split over tp, the router replicated: each device routes its own tokens."""
    return jax.shard_map(topk_route, mesh=mesh, in_specs=(P(TP), P()), out_specs=P(TP))(x, w_router)


def topk_route_local_experts(x, w_router, *, mesh):
    # BUG: the router's experts split over tp and top-k taken over each device's experts only (a
    # window of the sorted dim): every token keeps two experts per device
    def body(x, w):
        logits = x @ w
        top_p, top_i = lax.top_k(jax.nn.softmax(logits, axis=-1), TOPK)
        return jnp.einsum("tk,tke->te", top_p / top_p.sum(-1, keepdims=True), jax.nn.one_hot(top_i, logits.shape[-1]))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, TP)), out_specs=P(None, TP))(x, w_router)


def argsort_route(x, w_router):
    """Top-k by argsort (descending by negation): one-hot rows of each token's TOPK best experts."""
    order = jnp.argsort(-(x @ w_router), axis=-1)[:, :TOPK]
    return jax.nn.one_hot(order, EXP).sum(1)


def argsort_route_tokens(x, w_router, *, mesh):
    """Tokens split over tp: each device sorts its own tokens' expert logits (a sort's lanes)."""
    return jax.shard_map(argsort_route, mesh=mesh, in_specs=(P(TP), P()), out_specs=P(TP))(x, w_router)


# --- top-k weights written by a scatter into zeros: a sum of one-hots (equivci/translate/one_hots.py) ---
def _top_k_weights(x, w_router):
    top_p, top_i = lax.top_k(jax.nn.softmax(x @ w_router, axis=-1), TOPK)
    return top_p / top_p.sum(-1, keepdims=True), top_i


def _set_at_columns(base, values, columns):
    return base.at[jnp.arange(TOK)[:, None], columns].set(values)


def topk_set(x, w_router):
    """Routing weights [tokens, experts]: zeros overwritten at each token's top-k experts."""
    top_p, top_i = _top_k_weights(x, w_router)
    return _set_at_columns(jnp.zeros((TOK, EXP)), top_p, top_i)


def topk_set_vmapped(x, w_router):
    """The same weights, one token at a time: each token's zeros overwritten at its top-k experts."""
    top_p, top_i = _top_k_weights(x, w_router)
    return jax.vmap(lambda p, i: jnp.zeros(EXP).at[i].set(p))(top_p, top_i)


def _expert_columns(weights, n_local):
    return lax.dynamic_slice_in_dim(weights, lax.axis_index(TP) * n_local, n_local, axis=1)


def topk_set_experts(x, w_router, *, mesh):
    """Each device keeps its experts' columns of the one-hot sum over the top-k slots."""
    def body(x, w):
        top_p, top_i = _top_k_weights(x, w)
        weights = jnp.sum(jax.nn.one_hot(top_i, EXP) * top_p[..., None], axis=1)
        return _expert_columns(weights, EXP // lax.axis_size(TP))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P(None, TP))(x, w_router)


def topk_set_experts_rotated(x, w_router, *, mesh):
    # BUG: each device keeps the next device's expert columns (a wrong expert id)
    def body(x, w):
        top_p, top_i = _top_k_weights(x, w)
        weights = jnp.sum(jax.nn.one_hot(top_i, EXP) * top_p[..., None], axis=1)
        n_local = EXP // lax.axis_size(TP)
        return _expert_columns(jnp.roll(weights, -n_local, axis=1), n_local)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P(None, TP))(x, w_router)


def topk_set_repeated(x, w_router):
    """The first choice written twice: one slot holds two writes (the last one wins)."""
    top_p, top_i = _top_k_weights(x, w_router)
    return _set_at_columns(jnp.zeros((TOK, EXP)), top_p, top_i[:, :1].repeat(TOPK, axis=1))


def topk_summed_repeated(x, w_router, *, mesh):
    # BUG (against topk_set_repeated): one-hots summed where the reference overwrites one slot twice
    def body(x, w):
        top_p, top_i = _top_k_weights(x, w)
        columns = top_i[:, :1].repeat(TOPK, axis=1)
        return jnp.sum(jax.nn.one_hot(columns, EXP) * top_p[..., None], axis=1)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P()), out_specs=P(TP))(x, w_router)


def topk_set_into_ones(x, w_router):
    top_p, top_i = _top_k_weights(x, w_router)
    return _set_at_columns(jnp.ones((TOK, EXP)), top_p, top_i)


def topk_add_into_ones(x, w_router):
    top_p, top_i = _top_k_weights(x, w_router)
    return jnp.ones((TOK, EXP)).at[jnp.arange(TOK)[:, None], top_i].add(top_p)


def topk_ones_plus_one_hots(x, w_router, *, mesh):
    """ones + the one-hot sum: what adding at the top-k columns gives (not overwriting them)."""
    def body(x, w):
        top_p, top_i = _top_k_weights(x, w)
        return 1.0 + jnp.sum(jax.nn.one_hot(top_i, EXP) * top_p[..., None], axis=1)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P()), out_specs=P(TP))(x, w_router)

# --- clipped local ids, and logits made from a window of the head (equivci/translate/windows.py) ---
def _clipped(table, ids, mesh, top):
    """The local index clipped to [0, top(n)] instead of masked; the output masked by its own range."""

    def body(table, ids):
        n = table.shape[0]
        local = ids - lax.axis_index(TP) * n
        rows = table[jnp.clip(local, 0, top(n))]
        return lax.psum(jnp.where(((local >= 0) & (local < n))[..., None], rows, 0.0), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P())(table, ids)


def embed_clipped(table, ids, *, mesh):
    return _clipped(table, ids, mesh, lambda n: n - 1)


def embed_clipped_short(table, ids, *, mesh):
    # BUG: the clip stops a row short: a shard's last id reads the row before it
    return _clipped(table, ids, mesh, lambda n: n - 2)



# --- lookups at ids - lo by a gather that clamps its own index (jnp.take(mode="clip")) -----------
def _take_clip(table, ids, mesh, first=lambda lo, n: lo, end=lambda lo, n: lo + n, row=0):
    """Each shard takes rows at `ids - lo + row` (the gather clamps the index into its rows) and
    keeps those of the ids in [first, end) (on its local ids)."""

    def body(table, ids):
        n = table.shape[0]
        lo = lax.axis_index(TP) * n
        local = ids - lo
        rows = jnp.take(table, local + row, axis=0, mode="clip")
        mine = (local >= first(lo, n) - lo) & (local < end(lo, n) - lo)
        return lax.psum(jnp.where(mine[..., None], rows, 0.0), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P())(table, ids)


def embed_take_clip(table, ids, *, mesh):
    return _take_clip(table, ids, mesh)


def embed_take_clip_next(table, ids, *, mesh):
    # BUG: every id reads the row after its own
    return _take_clip(table, ids, mesh, row=1)


def embed_take_clip_uneven(table, ids, *, mesh):
    # BUG: the windows tile the ids, but shard 0 claims one id past its rows: the gather clamps id n
    # to shard 0's last row (and shard 1 starts one id late)
    n = V // 2
    return _take_clip(table, ids, mesh, first=lambda lo, n_: jnp.where(lo == 0, 0, lo + 1),
                      end=lambda lo, n_: jnp.where(lo == 0, n + 1, lo + n_))


# --- lookups masked by the complement of their window: where(outside, 0, rows) (De Morgan) -------
def _outside(table, ids, mesh, outside_of, fill=0.0):
    """Each shard zeroes the rows of ids outside its window; `outside_of(ids, lo, n)` tests them."""

    def body(table, ids):
        n = table.shape[0]
        lo = lax.axis_index(TP) * n
        outside = outside_of(ids, lo, n)
        rows = table[jnp.where(outside, 0, ids - lo)]
        return lax.psum(jnp.where(outside[..., None], fill, rows), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P())(table, ids)


def embed_outside(table, ids, *, mesh):
    return _outside(table, ids, mesh, lambda i, lo, n: (i < lo) | (i >= lo + n))


def embed_outside_not(table, ids, *, mesh):
    return _outside(table, ids, mesh, lambda i, lo, n: ~((i >= lo) & (i < lo + n)))


def embed_outside_drops_first(table, ids, *, mesh):
    # BUG: `<=` also counts the shard's first id as outside: it is never looked up
    return _outside(table, ids, mesh, lambda i, lo, n: (i <= lo) | (i >= lo + n))


def embed_outside_and(table, ids, *, mesh):
    # BUG: `&` for `|`: no id is outside (both tests never hold at once), every shard adds a row
    return _outside(table, ids, mesh, lambda i, lo, n: (i < lo) & (i >= lo + n))


def embed_outside_ones(table, ids, *, mesh):
    # BUG: the ids outside a shard add ones, not zeros
    return _outside(table, ids, mesh, lambda i, lo, n: (i < lo) | (i >= lo + n), fill=1.0)


def head_inputs():
    return (spec(3, D), spec(D, V), spec(V))


def head_max(h, w, b):
    return jnp.max(h @ w + b, axis=1)


def _head_max(h, w, b, mesh, bias_of):
    def f(h, w, b):
        return lax.pmax(jnp.max(h @ w + bias_of(b, w.shape[1]), axis=1), TP)

    return jax.shard_map(f, mesh=mesh, in_specs=(P(), P(None, TP), P(TP)), out_specs=P())(h, w, b)


def head_max_tp(h, w, b, *, mesh):
    """The max over shards of logits each makes from its columns of the head and its bias (correct)."""
    return _head_max(h, w, b, mesh, lambda b, n: b)


def head_max_first_bias(h, w, b, *, mesh):
    # BUG: every shard adds the first shard's bias to its own columns
    return _head_max(h, w, b, mesh, lambda b, n: lax.all_gather(b, TP, tiled=True)[:n])


# --- sort-based dispatch: argsort, ragged groups from cumsum(bincount), un-sort (translate/permutations.py) ---
SORT_T, SORT_E, SORT_F = 8, 4, 8  # tokens, experts, expert hidden width


def sorted_inputs():
    return (spec(SORT_T, D), spec(D, SORT_E), spec(SORT_E, D, SORT_F), spec(SORT_E, SORT_F, D))


def _sorted_moe(x, router, w1, w2, bug=None):
    """Top-1 MoE written with masks: tokens sorted by expert, every expert run on every sorted row,
    each row kept from the expert whose group [starts[e], ends[e]) holds it, then un-sorted with
    the inverse permutation."""
    logits = x @ router
    expert = jnp.argmax(logits, axis=-1)
    gate = jax.nn.sigmoid(jnp.max(logits, axis=-1))
    order = jnp.argsort(expert, stable=True)
    ends = jnp.cumsum(jnp.bincount(expert, length=SORT_E))
    starts = jnp.concatenate([jnp.zeros(1, ends.dtype), ends[:-1]])
    rows = jnp.arange(x.shape[0])[None, :]
    upper = rows <= ends[:, None] if bug == "inclusive-end" else rows < ends[:, None]
    mask = (rows >= starts[:, None]) & upper  # [E, T]
    h = jax.nn.relu(jnp.einsum("td,edf->etf", x[order], w1))
    ys = jnp.sum(jnp.einsum("etf,efd->etd", h, w2) * mask[:, :, None], axis=0)
    if bug == "gate-in-sorted-order":
        return (ys * gate[:, None])[jnp.argsort(order)]
    inverse = order if bug == "unsort-by-order" else jnp.argsort(order)
    return ys[inverse] * gate[:, None]


def sorted_moe(x, router, w1, w2):
    return _sorted_moe(x, router, w1, w2)


def _sorted_tokens(x, router, w1, w2, mesh, bug=None, layer=None):
    """Tokens split over tp; each device sorts, runs and un-sorts its own tokens."""
    layer = layer or _sorted_moe
    return jax.shard_map(
        lambda *a: layer(*a, bug=bug), mesh=mesh, in_specs=(P(TP), P(), P(), P()), out_specs=P(TP)
    )(x, router, w1, w2)


def sorted_moe_tokens(x, router, w1, w2, *, mesh):
    return _sorted_tokens(x, router, w1, w2, mesh)


def sorted_moe_inclusive_end(x, router, w1, w2, *, mesh):
    # BUG: a group's mask includes the first row of the next group (b <= ends[e])
    return _sorted_tokens(x, router, w1, w2, mesh, "inclusive-end")


def sorted_moe_unsort_by_order(x, router, w1, w2, *, mesh):
    # BUG: un-sorts by gathering with the sort's permutation again instead of its inverse
    return _sorted_tokens(x, router, w1, w2, mesh, "unsort-by-order")


def sorted_moe_gate_in_sorted_order(x, router, w1, w2, *, mesh):
    # BUG: multiplies the sorted rows by the gates of the unsorted tokens
    return _sorted_tokens(x, router, w1, w2, mesh, "gate-in-sorted-order")


def _scatter_back(x, router, w1, w2, into):
    """The same layer with lax.ragged_dot over the sorted rows, put back by a scatter."""
    logits = x @ router
    expert = jnp.argmax(logits, axis=-1)
    order = jnp.argsort(expert, stable=True)
    sizes = jnp.bincount(expert, length=SORT_E).astype(jnp.int32)
    ys = lax.ragged_dot(jax.nn.relu(lax.ragged_dot(x[order], w1, sizes)), w2, sizes)
    return into(ys).at[order].add(ys) * jax.nn.sigmoid(jnp.max(logits, axis=-1))[:, None]


def ragged_moe(x, router, w1, w2):
    return _scatter_back(x, router, w1, w2, jnp.zeros_like)


def ragged_moe_tokens(x, router, w1, w2, *, mesh):
    return jax.shard_map(
        lambda *a: _scatter_back(*a, jnp.zeros_like), mesh=mesh, in_specs=(P(TP), P(), P(), P()), out_specs=P(TP)
    )(x, router, w1, w2)


def ragged_moe_add_into_ones(x, router, w1, w2, *, mesh):
    # BUG: the rows are added back into ones, not zeros
    return jax.shard_map(
        lambda *a: _scatter_back(*a, jnp.ones_like), mesh=mesh, in_specs=(P(TP), P(), P(), P()), out_specs=P(TP)
    )(x, router, w1, w2)


def ragged_moe_added_at_inverse(x, router, w1, w2, *, mesh):
    # BUG: the sorted rows are added back at the inverse permutation's rows instead of the sort's
    def body(x, router, w1, w2):
        logits = x @ router
        expert = jnp.argmax(logits, axis=-1)
        order = jnp.argsort(expert, stable=True)
        sizes = jnp.bincount(expert, length=SORT_E).astype(jnp.int32)
        ys = lax.ragged_dot(jax.nn.relu(lax.ragged_dot(x[order], w1, sizes)), w2, sizes)
        return jnp.zeros_like(ys).at[jnp.argsort(order)].add(ys) * jax.nn.sigmoid(jnp.max(logits, axis=-1))[:, None]

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P(), P(), P()), out_specs=P(TP))(x, router, w1, w2)


def _sorted_top2(x, router, w1, w2, bug=None):
    """Top-2 in the style of a sorted dispatch of (token, choice) pairs: the pairs' expert ids
    flattened and argsorted, each pair's token row gathered through repeat(arange(tokens), 2),
    group sizes from a one-hot summed over tokens and choices, the pairs un-sorted and summed."""
    _, choice = lax.top_k(x @ router, 2)  # [T, 2]
    order = jnp.argsort(choice.ravel())
    tokens = jnp.arange(x.shape[0])
    token_of_pair = jnp.tile(tokens, 2) if bug == "tiled-token-ids" else jnp.repeat(tokens, 2)
    counts = jax.nn.one_hot(choice, SORT_E, dtype=jnp.int32).sum(axis=(0, 1))
    ends = jnp.cumsum(counts)
    rows = jnp.arange(2 * x.shape[0])[None, :]
    mask = (rows >= (ends - counts)[:, None]) & (rows < ends[:, None])
    h = jax.nn.relu(jnp.einsum("td,edf->etf", x[token_of_pair[order]], w1))
    ys = jnp.sum(jnp.einsum("etf,efd->etd", h, w2) * mask[:, :, None], axis=0)
    return ys[jnp.argsort(order)].reshape(x.shape[0], 2, -1).sum(axis=1)


def sorted_top2(x, router, w1, w2):
    return _sorted_top2(x, router, w1, w2)


def sorted_top2_tokens(x, router, w1, w2, *, mesh):
    return jax.shard_map(
        lambda *a: _sorted_top2(*a), mesh=mesh, in_specs=(P(TP), P(), P(), P()), out_specs=P(TP)
    )(x, router, w1, w2)


def sorted_top2_tiled_token_ids(x, router, w1, w2, *, mesh):
    # BUG: pair p's token is p % T (tile) instead of p // 2 (repeat): pairs read other tokens' rows
    return jax.shard_map(
        lambda *a: _sorted_top2(*a, bug="tiled-token-ids"), mesh=mesh, in_specs=(P(TP), P(), P(), P()),
        out_specs=P(TP),
    )(x, router, w1, w2)


# --- the sorted rows' expert ids from the group sizes (translate/group_ids.py) ---
def _sorted_ids(x, router, w1, w2, bug=None):
    """Each token's rows scaled by a per-expert factor taken in sorted order: the expert of each
    sorted row is jnp.repeat(arange(E), bincount(expert)) (marks at the groups' starts, counted),
    or the same count written by hand with marks at the groups' ends."""
    expert = jnp.argmax(x @ router, axis=-1)
    order = jnp.argsort(expert, stable=True)
    counts = jnp.bincount(expert, length=SORT_E)
    n = x.shape[0]
    if bug in ("ends", "ends-minus-one"):
        marks = jnp.zeros(n, jnp.int32).at[jnp.cumsum(counts)].add(1)
        ids = jnp.cumsum(marks) - (1 if bug == "ends-minus-one" else 0)
    elif bug in ("starts", "starts-minus-two"):
        marks = jnp.zeros(n, jnp.int32).at[jnp.cumsum(counts) - counts].add(1)
        ids = jnp.cumsum(marks) - (2 if bug == "starts-minus-two" else 1)
    else:
        first = 1 if bug == "from-one" else 0
        ids = jnp.repeat(jnp.arange(first, SORT_E + first), counts, total_repeat_length=n)
    rows = x[order] * w2[:, 0, 0][ids][:, None]
    return rows[jnp.argsort(order)]


def scaled_rows(x, router, w1, w2):
    return x * w2[:, 0, 0][jnp.argmax(x @ router, axis=-1)][:, None]


def _sorted_ids_tokens(x, router, w1, w2, mesh, bug=None):
    return _sorted_tokens(x, router, w1, w2, mesh, bug, layer=_sorted_ids)


def sorted_ids_repeat(x, router, w1, w2, *, mesh):
    return _sorted_ids_tokens(x, router, w1, w2, mesh)


def sorted_ids_ends(x, router, w1, w2, *, mesh):
    return _sorted_ids_tokens(x, router, w1, w2, mesh, "ends")


def sorted_ids_ends_minus_one(x, router, w1, w2, *, mesh):
    # BUG: counting marks at the groups' ends already gives the group; the extra - 1 shifts every id
    return _sorted_ids_tokens(x, router, w1, w2, mesh, "ends-minus-one")


def sorted_ids_from_one(x, router, w1, w2, *, mesh):
    # BUG: the ids repeat arange(1, E + 1): every row takes the next expert's factor
    return _sorted_ids_tokens(x, router, w1, w2, mesh, "from-one")


def sorted_ids_starts(x, router, w1, w2, *, mesh):
    return _sorted_ids_tokens(x, router, w1, w2, mesh, "starts")


def sorted_ids_starts_minus_two(x, router, w1, w2, *, mesh):
    # BUG: marks at the groups' starts count the group plus one; minus two is one group too low
    return _sorted_ids_tokens(x, router, w1, w2, mesh, "starts-minus-two")


# -- slots of every group exchanged by all_to_all (translate/regroup.py pieces, relaid.py) ----------
SLOT_GROUPS, SLOT_TOKENS, SLOT_D, SLOT_E = 2, 6, 4, 4


def slot_inputs():
    return spec(SLOT_GROUPS * SLOT_TOKENS, SLOT_D), spec(SLOT_D, SLOT_E)


def _group_slots(xg, w):
    """[E, D]: each expert's sum of the group's tokens, weighted by their router probability."""
    probs = jax.nn.softmax(xg @ w, axis=-1)
    return jnp.einsum("te,td->ed", probs * (probs >= probs.max(-1, keepdims=True)), xg)


def slots_by_group(x, w):  # [G, E, D]
    return jax.vmap(_group_slots, in_axes=(0, None))(x.reshape(SLOT_GROUPS, SLOT_TOKENS, SLOT_D), w)


def _slots_exchanged(x, w, mesh, order):
    n = mesh.shape["ep"]

    def body(xg, w):
        mine = order(_group_slots(xg, w)).reshape(n, SLOT_E // n, SLOT_D)
        return lax.all_to_all(mine, "ep", split_axis=0, concat_axis=0, tiled=True)  # [G, E/n, D]

    return jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P()), out_specs=P(None, "ep"))(x, w)


def slots_exchanged(x, w, *, mesh):
    return _slots_exchanged(x, w, mesh, lambda s: s)


def slots_exchanged_swapped(x, w, *, mesh):  # each device gets the other device's experts
    return _slots_exchanged(x, w, mesh, lambda s: jnp.concatenate([s[SLOT_E // 2 :], s[: SLOT_E // 2]]))


def slots_by_expert(x, w):  # [E, G, D]: the reference's slots, expert-major
    return slots_by_group(x, w).transpose(1, 0, 2)


def _slots_to_experts(x, w, mesh, arrange):
    """Each device writes its group's slots as a transposed einsum, receives its experts' slots of
    every group [G, E/n, D] and arranges them expert-major (translate/relaid.py: a run read in
    another dim order, a dot of a piece's operands swapped)."""
    n = mesh.shape["ep"]

    def body(xg, w):
        probs = jax.nn.softmax(xg @ w, axis=-1)
        mine = jnp.einsum("td,te->de", xg, probs * (probs >= probs.max(-1, keepdims=True))).T
        got = lax.all_to_all(mine.reshape(n, SLOT_E // n, SLOT_D), "ep", split_axis=0, concat_axis=0, tiled=True)
        return arrange(got)

    return jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P()), out_specs=P("ep"))(x, w)


def slots_to_experts(x, w, *, mesh):
    return _slots_to_experts(x, w, mesh, lambda got: got.swapaxes(0, 1))


def slots_to_experts_reshaped(x, w, *, mesh):  # a reshape where the axes must be swapped
    return _slots_to_experts(x, w, mesh, lambda got: got.reshape(got.shape[1], got.shape[0], SLOT_D))

# --- a gather of one element per row as the sum against a one-hot (equivci/translate/picks.py) ----
def pick_inputs():
    return (spec(V, V), spec(V, dtype=jnp.int32))


def _picked(x, ids, mode=None):
    return jnp.take_along_axis(x, ids[:, None], axis=-1, mode=mode)[:, 0]


def _one_hot_sum(x, ids, mesh):
    """The vocabulary dim cut by the SPMD partitioner: each device sums its columns against its
    columns of the one-hot (an iota offset by the partition's start), then an all-reduce."""
    x = lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, P(None, TP)))
    return jnp.sum(x * jax.nn.one_hot(ids, V, dtype=x.dtype), axis=-1)


def pick(x, ids):
    return _picked(x, ids)


def pick_one_hot(x, ids, *, mesh):
    return _one_hot_sum(x, ids, mesh)


def pick_one_hot_next(x, ids, *, mesh):
    return _one_hot_sum(x, ids + 1, mesh)  # BUG: the next column's logit


def pick_next_clipped(x, ids):
    """A raw gather (no range check) at ids + 1 clipped to [0, V], which XLA clamps: V reads V - 1."""
    return _picked(x, jnp.clip(ids + 1, 0, V), mode="promise_in_bounds")


def pick_one_hot_next_clipped(x, ids, *, mesh):
    # BUG: the one-hot of V is all zeros where the reference's clamped gather reads column V - 1;
    # only the bounds of the index, [0, V], tell the gather from the one-hot sum
    return _one_hot_sum(x, jnp.clip(ids + 1, 0, V), mesh)


def _vocab_pick(x, ids, mesh, picked):
    """A vocabulary-parallel pick written by hand: each device's columns are lo + arange(n)."""

    def body(x, ids):
        n = x.shape[-1]
        return lax.psum(jnp.sum(picked(x, ids, lax.axis_index(TP) * n, n), axis=-1), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP), P()), out_specs=P())(x, ids)


def pick_where_ids(x, ids, *, mesh):  # the columns compared against the ids, selected against zeros
    return _vocab_pick(x, ids, mesh, lambda x, t, lo, n: jnp.where(lo + jnp.arange(n) == t[:, None], x, 0.0))


def pick_local_one_hot(x, ids, *, mesh):  # the one-hot of the local id
    return _vocab_pick(x, ids, mesh, lambda x, t, lo, n: x * jax.nn.one_hot(t - lo, n, dtype=x.dtype))


def pick_where_next_shard(x, ids, *, mesh):
    # BUG: the next shard's columns (offset by one shard)
    return _vocab_pick(x, ids, mesh, lambda x, t, lo, n: jnp.where(lo + n + jnp.arange(n) == t[:, None], x, 0.0))


def pick_where_ge(x, ids, *, mesh):
    # BUG: `>=` for `==`: every column at or past the id
    return _vocab_pick(x, ids, mesh, lambda x, t, lo, n: jnp.where(lo + jnp.arange(n) >= t[:, None], x, 0.0))


def pick_local_one_hot_plus_one(x, ids, *, mesh):
    # BUG: the local id off by one (lo - 1 taken for lo)
    return _vocab_pick(x, ids, mesh, lambda x, t, lo, n: x * jax.nn.one_hot(t - lo + 1, n, dtype=x.dtype))


def pick_where_ones(x, ids, *, mesh):
    # BUG: the other columns count as ones, not zeros
    return _vocab_pick(x, ids, mesh, lambda x, t, lo, n: jnp.where(lo + jnp.arange(n) == t[:, None], x, 1.0))


# --- a router's ids and gate: argmax of an increasing map, the pick at the argmax (translate/orders.py)
ROUTER_T, ROUTER_E = 8, 4


def router_inputs():
    return (spec(2 * ROUTER_T, D), spec(D, ROUTER_E))


def route(x, w):
    probs = jax.nn.softmax(x @ w, axis=-1)
    return jnp.max(probs, axis=-1) * (jnp.argmax(probs, axis=-1) + 1)


def _route_rows(x, w, mesh, ids_of):
    def body(x, w):
        logits = x @ w
        idx = ids_of(logits)
        gate = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), idx[:, None], axis=-1)[:, 0]
        return gate * (idx + 1)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P()), out_specs=P(TP))(x, w)


def route_logits(x, w, *, mesh):  # argmax of the logits, not of the probabilities; the gate picked there
    return _route_rows(x, w, mesh, lambda lg: jnp.argmax(lg, axis=-1))


def route_argmin(x, w, *, mesh):
    # BUG: the least logit's expert
    return _route_rows(x, w, mesh, lambda lg: jnp.argmin(lg, axis=-1))


def route_negated(x, w, *, mesh):
    # BUG: argmax of -logits (a decreasing map)
    return _route_rows(x, w, mesh, lambda lg: jnp.argmax(-lg, axis=-1))


# --- sums over microbatches and devices regrouped; zero-padded pieces joined (translate/pieces.py) --
MICRO, ROWS, WIDTH = 2, 8, 3  # microbatches of ROWS rows, each split over 2 devices


def accum_inputs():
    return (spec(WIDTH * 2 + 2), spec(MICRO, ROWS, WIDTH))


def _accum_loss(flat, x):
    w, b = flat[: WIDTH * 2].reshape(WIDTH, 2), flat[WIDTH * 2 :]
    return jnp.mean(jnp.sum((x @ w + b) ** 2, -1))


def _accum(flat, xs, loss):
    def micro(g, x):
        value, grad = jax.value_and_grad(loss)(flat, x)
        return g + grad, value

    g, losses = lax.scan(micro, jnp.zeros_like(flat), xs)
    return g, losses


def accum_step(flat, xs):
    """Gradient accumulation over microbatches of a flat parameter vector: the mean loss, the mean gradient."""
    g, losses = _accum(flat, xs, _accum_loss)
    return g / MICRO, jnp.mean(losses)


def _accum_step_dp(flat, xs, mesh, losses_of):
    def body(flat, xs):
        g, losses = _accum(flat, xs, _accum_loss)
        return lax.pmean(g, TP) / MICRO, lax.pmean(losses_of(losses), TP)

    # without the varying-axes check, the gradient of the replicated vector stays each device's own
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, TP)), out_specs=(P(), P()), check_vma=False)(
        flat, xs
    )


def accum_step_dp(flat, xs, *, mesh):
    """Rows split over devices; each device's mean over its microbatches, then the mean over devices."""
    return _accum_step_dp(flat, xs, mesh, jnp.mean)


def accum_step_dp_first_micro(flat, xs, *, mesh):
    return _accum_step_dp(flat, xs, mesh, lambda losses: losses[0])  # BUG: the first microbatch's loss only


# --- a partial sum carried through linear ops before the psum: translate/linear_sums.py ----------
ROWS_L, K_L, N_L = 4, 8, 6


def linear_inputs():
    return (spec(ROWS_L, K_L), spec(K_L, N_L), spec(ROWS_L), spec(ROWS_L, dtype=jnp.int32))


def _pairs_summed(y):
    return y.reshape(N_L // 2, 2, ROWS_L).sum(1)


def gated_projection(x, w, gate, ids):
    """A projection scaled per row, rows taken at ids, transposed, adjacent columns summed."""
    return _pairs_summed(jnp.take(x @ w * gate[:, None], ids, axis=0, mode="clip").T)


def _contraction_split(x, w, gate, ids, mesh, tail):
    def body(xs, ws, g, i):
        return lax.psum(tail(xs @ ws, g, i, lax.axis_index(TP)), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP), P(TP), P(), P()), out_specs=P(),
                         check_vma=False)(x, w, gate, ids)


def _gated_tail(partial, g, i, _):
    return _pairs_summed(jnp.take(partial * g[:, None], i, axis=0, mode="clip").T)


def gated_projection_tp(x, w, gate, ids, *, mesh):
    """The contraction split over tp; each device's partial sum goes through the gate, the take, the
    transpose and the sum of column pairs before the psum."""
    return _contraction_split(x, w, gate, ids, mesh, _gated_tail)


def expert_inputs():
    return (spec(ROWS_L, K_L), spec(2, K_L, N_L), spec(2, N_L, K_L), spec(ROWS_L, 2))


def experts_combined(x, w1, w2, weights):
    """Every expert's MLP on every row, combined by per-row expert weights."""
    h = jax.nn.gelu(jnp.einsum("td,edh->eth", x, w1))
    return jnp.einsum("te,etd->td", weights, jnp.einsum("eth,ehd->etd", h, w2))


def experts_combined_tp(x, w1, w2, weights, *, mesh):
    """The experts' hidden dim split over tp: the down projection's partial sums are combined by
    the (shared) expert weights before the psum."""

    def body(x, w1, w2, weights):
        return lax.psum(experts_combined(x, w1, w2, weights), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, None, TP), P(None, TP), P()), out_specs=P(),
                         check_vma=False)(x, w1, w2, weights)


def gated_projection_tp_bias(x, w, gate, ids, *, mesh):
    def tail(partial, g, i, d):
        return _gated_tail(partial + g[:, None], g, i, d)  # BUG: a shared term added before the psum: counted once per device

    return _contraction_split(x, w, gate, ids, mesh, tail)


def gated_projection_tp_device_gate(x, w, gate, ids, *, mesh):
    def tail(partial, g, i, d):
        return _gated_tail(partial, g * (d + 1), i, d)  # BUG: each device scales its partial sum by its own factor

    return _contraction_split(x, w, gate, ids, mesh, tail)


# --- a loss scale by powers of two at other places (translate/builder.py: Builder.times) ---------
def gelu_inputs():
    return (spec(D, 2 * D), spec(2 * D), spec(4 * D, D), spec(4 * D))


def _gelu_loss(w, v, x, y):
    return jnp.mean((jax.nn.gelu(x @ w) @ v - y) ** 2)


def gelu_grads(w, v, x, y):
    """The mean-squared-error gradients of a GELU layer: GELU's constants 0.797 and 0.0447 times the
    loss's 1/rows are products that are no float32 number."""
    return jax.grad(_gelu_loss, argnums=(0, 1))(w, v, x, y)


def _gelu_grads_dp(w, v, x, y, mesh, reduce):
    def body(w, v, x, y):
        # each device's mean over its rows (a scale of 1 / (rows / 2)), then averaged over devices
        return reduce(jax.grad(_gelu_loss, argnums=(0, 1))(lax.pcast(w, TP, to="varying"),
                                                          lax.pcast(v, TP, to="varying"), x, y))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(TP), P(TP)), out_specs=P())(w, v, x, y)


def gelu_grads_dp(w, v, x, y, *, mesh):
    return _gelu_grads_dp(w, v, x, y, mesh, lambda g: lax.pmean(g, TP))


def gelu_grads_dp_summed(w, v, x, y, *, mesh):
    return _gelu_grads_dp(w, v, x, y, mesh, lambda g: lax.psum(g, TP))  # BUG: the 1/n of the mean dropped


def gelu_grads_dp_halved(w, v, x, y, *, mesh):
    # BUG: averaged twice: a factor of two the odd constants of GELU must not hide
    return _gelu_grads_dp(w, v, x, y, mesh, lambda g: jax.tree.map(lambda t: lax.pmean(t, TP) / 2, g))

# ---- cross-entropy on vocabulary shards: a sum of signed terms in one form (translate/signed_sums.py)


def cross_entropy(x, ids):
    """The per-row loss as log-softmax picked: -((x_t - m) - log Σ exp(x - m))."""
    return -_picked(jax.nn.log_softmax(x, axis=-1), ids)


def _sharded_cross_entropy(x, ids, mesh, loss):
    """Each device holds columns lo + arange(n): the max, the sum of exponentials and the target's
    logit are combined over the shards, then `loss(log_sum, m, target)`."""

    def body(x, ids):
        n = x.shape[-1]
        lo = lax.axis_index(TP) * n
        m = lax.pmax(lax.stop_gradient(jnp.max(x, axis=-1)), TP)
        log_sum = jnp.log(lax.psum(jnp.sum(jnp.exp(x - m[:, None]), axis=-1), TP))
        target = lax.psum(jnp.sum(jnp.where(lo + jnp.arange(n) == ids[:, None], x, 0.0), axis=-1), TP)
        return loss(log_sum, m, target)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP), P()), out_specs=P())(x, ids)


def cross_entropy_vp(x, ids, *, mesh):  # lse - target, lse = log_sum + m
    return _sharded_cross_entropy(x, ids, mesh, lambda log_sum, m, target: log_sum + m - target)


def cross_entropy_vp_negated(x, ids, *, mesh):  # another grouping: -((target - m) - log_sum)
    return _sharded_cross_entropy(x, ids, mesh, lambda log_sum, m, target: -((target - m) - log_sum))


def cross_entropy_vp_minus_max(x, ids, *, mesh):
    # BUG: the max subtracted where it must be added back
    return _sharded_cross_entropy(x, ids, mesh, lambda log_sum, m, target: log_sum - m - target)


def cross_entropy_vp_target_twice(x, ids, *, mesh):
    # BUG: the target's logit subtracted twice, once in another grouping
    return _sharded_cross_entropy(x, ids, mesh, lambda log_sum, m, target: (log_sum - target) + (m - target))


# ---- an embedding looked up by a one-hot product: translate/picks.py (row_one_hot_dot)


def _one_hot_embed(table, ids, mesh, local_ids):
    """Each device's rows of the table against its columns of the one-hot, summed over the shards."""

    def body(table, ids):
        n = table.shape[0]
        hot = jax.nn.one_hot(local_ids(ids, lax.axis_index(TP) * n), n, dtype=table.dtype)
        return lax.psum(hot @ table, TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P())(table, ids)


def embed_one_hot(table, ids, *, mesh):
    return _one_hot_embed(table, ids, mesh, lambda ids, lo: ids - lo)


def embed_one_hot_next(table, ids, *, mesh):
    # BUG: every id reads the row after its own (the last id none)
    return _one_hot_embed(table, ids, mesh, lambda ids, lo: ids + 1 - lo)


def embed_past_end(table, ids):
    """A raw gather (no range check) at ids + 1 clipped to [0, V], which XLA clamps: V reads V - 1."""
    return table.at[jnp.clip(ids + 1, 0, V)].get(mode="promise_in_bounds")


def embed_one_hot_past_end(table, ids, *, mesh):
    # BUG: the one-hot of V is all zeros where the reference's clamped gather reads row V - 1; only
    # the bounds of the index, [0, V], tell the gather from the one-hot product
    return _one_hot_embed(table, ids, mesh, lambda ids, lo: jnp.clip(ids + 1, 0, V) - lo)


def smoothed_cross_entropy(x, ids):
    """Label smoothing: the mean log-probability over the vocabulary, Σ (x - lse) / V, mixed in."""
    logp = jax.nn.log_softmax(x, axis=-1)
    return 0.75 * -_picked(logp, ids) - 0.25 * jnp.mean(logp, axis=-1)


def _smoothed_vp(x, ids, mesh, counted):
    """lse and the logits' sum over the vocabulary combined over the shards; `counted(lse, total)`
    is the mean log-probability's negation."""

    def body(x, ids):
        n = x.shape[-1]
        lo = lax.axis_index(TP) * n
        m = lax.pmax(lax.stop_gradient(jnp.max(x, axis=-1)), TP)
        lse = m + jnp.log(lax.psum(jnp.sum(jnp.exp(x - m[:, None]), axis=-1), TP))
        target = lax.psum(jnp.sum(jnp.where(lo + jnp.arange(n) == ids[:, None], x, 0.0), axis=-1), TP)
        total = lax.psum(jnp.sum(x, axis=-1), TP)
        return 0.75 * (lse - target) + 0.25 * counted(lse, total)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP), P()), out_specs=P())(x, ids)


def smoothed_cross_entropy_vp(x, ids, *, mesh):  # -mean(x - lse) = lse - Σ x / V
    return _smoothed_vp(x, ids, mesh, lambda lse, total: lse - total / V)


def smoothed_cross_entropy_vp_lse_once(x, ids, *, mesh):
    # BUG: lse counted once in the sum over the vocabulary, not V times
    return _smoothed_vp(x, ids, mesh, lambda lse, total: (lse - total) / V)


# ---- a pick written as the one-hot times the logits (either product order), on 1-D and 2-D meshes


def _one_hot_first(x, ids, offset_axis):
    n = x.shape[-1]
    return jnp.sum(jax.nn.one_hot(ids - lax.axis_index(offset_axis) * n, n) * x, axis=-1)


def pick_one_hot_first(x, ids, *, mesh):
    return jax.shard_map(lambda x, ids: lax.psum(_one_hot_first(x, ids, TP), TP), mesh=mesh,
                         in_specs=(P(None, TP), P()), out_specs=P())(x, ids)


def _pick_2d(x, ids, mesh, offset_axis):
    """Rows over `batch`, the vocabulary over `tp`: each device picks in its rows' columns."""
    return jax.shard_map(lambda x, ids: lax.psum(_one_hot_first(x, ids, offset_axis), TP), mesh=mesh,
                         in_specs=(P("batch", TP), P("batch")), out_specs=P("batch"))(x, ids)


def pick_one_hot_2d(x, ids, *, mesh):
    return _pick_2d(x, ids, mesh, TP)


def pick_one_hot_2d_batch_offset(x, ids, *, mesh):
    # BUG: the columns' offset taken from the batch axis's index, not the vocabulary's
    return _pick_2d(x, ids, mesh, "batch")


# ---- positions at an offset on sequence shards: (start + d * n) + arange(n) is the window of
# start + arange(T) (translate/elementwise.py: offset_merged)

POSITIONS = 16  # rows of the position table


def position_inputs():
    return (spec(POSITIONS, D), spec(S * 2, D), spec(dtype=jnp.int32))


def positions_at(table, x, start):
    pos = start + jnp.arange(x.shape[0])
    h = x + table[pos]
    return _window_scores_against(h, h, pos, pos)


def _positions_sp(table, x, start, mesh, local_pos, offset_axis=TP):
    """Rows over tp; each device's positions `local_pos(start, index along offset_axis, n)`, the
    keys gathered."""

    def body(table, x, start):
        n = x.shape[0]
        pos = local_pos(start, lax.axis_index(offset_axis), n)
        h = x + jnp.take(table, pos, axis=0)
        everyone = lax.all_gather(h, TP, tiled=True)
        return _window_scores_against(h, everyone, pos, start + jnp.arange(everyone.shape[0]))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(TP), P()), out_specs=P(TP),
                         check_vma=offset_axis == TP)(table, x, start)


def _window_scores_against(q, k, q_pos, k_pos):
    """q's rows against the k rows within 3 positions before them (a sliding window)."""
    dist = q_pos[:, None] - k_pos[None, :]
    return jnp.where((dist >= 0) & (dist < 3), q @ k.T, 0.0)


def _at_shard(s, d, n):
    return s + d * n + lax.iota(jnp.int32, n)


def positions_sp(table, x, start, *, mesh):  # (start + d * n) + iota(n)
    return _positions_sp(table, x, start, mesh, _at_shard)


def positions_sp_offset_first(table, x, start, *, mesh):  # (d * n + start) + arange(n)
    return _positions_sp(table, x, start, mesh, lambda s, d, n: d * n + s + jnp.arange(n))


def positions_sp_one_late(table, x, start, *, mesh):
    # BUG: each shard's positions start one late
    return _positions_sp(table, x, start, mesh, lambda s, d, n: s + d * n + 1 + lax.iota(jnp.int32, n))


def positions_sp_2d_batch_index(table, x, start, *, mesh):
    # BUG: on a batch x tp mesh, the shard's offset taken from the batch axis's index, not tp's
    return _positions_sp(table, x, start, mesh, _at_shard, offset_axis="batch")


# --- GQA's gradient: jnp.repeat's transpose sums each KV head's group of query heads --------------
# A device holding one KV head reduces over that head as a size-1 dim (equivci/translate/reductions.py).
def _repeated(k):
    return jnp.repeat(k, 2, axis=1)


def _broadcast(k):  # the same repeat written as a broadcast of a new group dim, merged into the heads
    s, kv, d = k.shape
    return jnp.broadcast_to(k[:, :, None, :], (s, kv, 2, d)).reshape(s, 2 * kv, d)


def _half_repeated(k):
    # BUG: the second query head of each group passes no gradient back to its KV head
    kk = _repeated(k)
    return jnp.where((jnp.arange(kk.shape[1]) % 2 == 0)[None, :, None], kk, lax.stop_gradient(kk))


def _gqa_loss(q, k, v, repeat=_repeated):
    """q [s, h, d], k and v [s, kv, d]: each KV head serves 2 query heads."""
    probs = jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, repeat(k)), axis=-1)
    return jnp.sum(jnp.tanh(jnp.einsum("hqk,khd->qhd", probs, repeat(v))))


def gqa_grad(q, k, v):
    return jax.grad(_gqa_loss, argnums=(1, 2))(q, k, v)


def _gqa_grad_tp(q, k, v, mesh, repeat):
    heads = P(None, TP, None)
    body = lambda q, k, v: jax.grad(_gqa_loss, argnums=(1, 2))(q, k, v, repeat)  # noqa: E731
    return jax.shard_map(body, mesh=mesh, in_specs=(heads, heads, heads), out_specs=(heads, heads))(q, k, v)


def gqa_grad_tp(q, k, v, *, mesh):
    return _gqa_grad_tp(q, k, v, mesh, _repeated)


def gqa_grad_broadcast(q, k, v, *, mesh):
    return _gqa_grad_tp(q, k, v, mesh, _broadcast)


def gqa_grad_half(q, k, v, *, mesh):
    return _gqa_grad_tp(q, k, v, mesh, _half_repeated)


def gqa_inputs():
    return (spec(8, 4, D), spec(8, 2, D), spec(8, 2, D))


# --- a training step split into passes: each layer's forward, then each layer's backward ---------
def _mlp_layer(x, w1, w2, reduce=lambda t: t, cut=False):
    h = lax.stop_gradient(x) if cut else x  # cut: BUG, the branch passes no gradient back to x
    return x + reduce(jax.nn.gelu(h @ w1) @ w2)


def _sgd(forward, x, params):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean(forward(x, p) ** 2))(params)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), loss


def mlp_step(x, params):
    def forward(x, params):
        for i, (w1, w2) in enumerate(params):
            with jax.named_scope(f"layers_{i}"):
                x = _mlp_layer(x, w1, w2)
        return x

    return _sgd(forward, x, params)


def _mlp_step_tp(x, params, mesh, cut=None):
    def body(x, params):
        for i, (w1, w2) in enumerate(params):
            with jax.named_scope(f"layers_{i}"):
                x = _mlp_layer(x, w1, w2, lambda t: lax.psum(t, TP), cut=i == cut)
        return x

    specs = (P(), [(P(None, TP), P(TP, None))] * len(params))
    return _sgd(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P()), x, params)


def mlp_step_tp(x, params, *, mesh):
    return _mlp_step_tp(x, params, mesh)


def mlp_step_layer_cut(x, params, *, mesh):
    return _mlp_step_tp(x, params, mesh, cut=1)


def mlp_step_inputs():
    return (spec(4, 8), [(spec(8, 16), spec(16, 8)) for _ in range(4)])
# --- a window of key positions written as a distance: translate/elementwise.py (offset_moved) ----
WINDOW = 3  # keys visible to a query: its own position and the WINDOW - 1 before it


def distance_inputs():
    return (spec(POSITIONS, D), spec(S * 2, D), spec(dtype=jnp.int32))


def window_keys(table, x, start):
    """Queries at `start + arange(T)` against keys at positions arange(T): the reference tests the
    key positions against the query's."""
    q_pos, k_pos = start + jnp.arange(x.shape[0]), jnp.arange(x.shape[0])
    h = x + table[q_pos]
    visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - WINDOW)
    return jnp.where(visible, h @ x.T, 0.0)


def _window_distance_sp(table, x, start, mesh, visible_of, local_pos=_at_shard):
    """Query rows over tp, every key on every device; `visible_of(q_pos, k_pos)` the mask."""

    def body(table, x, start):
        n = x.shape[0]
        q_pos = local_pos(start, lax.axis_index(TP), n)
        h = x + jnp.take(table, q_pos, axis=0)
        keys = lax.all_gather(x, TP, tiled=True)
        visible = visible_of(q_pos, jnp.arange(keys.shape[0]))
        return jnp.where(visible, h @ keys.T, 0.0)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(TP), P()), out_specs=P(TP))(table, x, start)


def _distance(q_pos, k_pos):
    dist = q_pos[:, None] - k_pos[None, :]
    return (dist >= 0) & (dist < WINDOW)


def window_distance(table, x, start, *, mesh):  # the distance q - k in [0, WINDOW)
    return _window_distance_sp(table, x, start, mesh, _distance)


def window_distance_negated(table, x, start, *, mesh):  # k - q in [1 - WINDOW, 0], bounds on the left
    def visible(q_pos, k_pos):
        back = k_pos[None, :] - q_pos[:, None]
        return (0 >= back) & (1 - WINDOW <= back)

    return _window_distance_sp(table, x, start, mesh, visible)


def window_distance_wide(table, x, start, *, mesh):
    def visible(q_pos, k_pos):
        dist = q_pos[:, None] - k_pos[None, :]
        return (dist >= 0) & (dist <= WINDOW)  # BUG: `<=` lets one key more into the window

    return _window_distance_sp(table, x, start, mesh, visible)


def window_distance_no_start(table, x, start, *, mesh):
    # BUG: the queries' positions without the start offset (d * n + arange(n))
    return _window_distance_sp(table, x, start, mesh, _distance, lambda s, d, n: d * n + lax.iota(jnp.int32, n))


def window_distance_inclusive_start(table, x, start, *, mesh):
    def visible(q_pos, k_pos):
        dist = q_pos[:, None] - k_pos[None, :]
        return (dist > 0) & (dist < WINDOW)  # BUG: `>` drops the query's own position

    return _window_distance_sp(table, x, start, mesh, visible)


# --- a top-k router's gates times the picked experts' outputs: translate/picks.py (weighted_pick) -
EXPERTS, TOP = 4, 2


def weighted_pick_inputs():
    return (spec(S * 2, D), spec(D, EXPERTS), spec(EXPERTS, D, D))


def weighted_pick(x, router, w):
    """Every expert on every token, the top-2 picked with take_along_axis and weighted by the gates."""
    top_logits, top_idx = lax.top_k(x @ router, TOP)
    gates = jax.nn.softmax(top_logits, axis=-1)
    ys = jnp.swapaxes(jnp.einsum("nd,edf->enf", x, w), 0, 1)  # [N, E, D]
    picked = jnp.take_along_axis(ys, top_idx[..., None], axis=1)
    return jnp.einsum("nk,nkd->nd", gates, picked)


def _weighted_pick_ep(x, router, w, mesh, local_gates_of):
    """Experts over tp, tokens on every device: each keeps the gates of the experts it owns
    (`local_gates_of(top_idx, gates, first owned expert, experts per device)`) and psums."""

    def body(x, router, w):
        n = w.shape[0]
        top_logits, top_idx = lax.top_k(x @ router, TOP)
        gates = jax.nn.softmax(top_logits, axis=-1)
        local = local_gates_of(top_idx, gates, lax.axis_index(TP) * n, n)
        return lax.psum(jnp.einsum("ne,end->nd", local, jnp.einsum("nd,edf->enf", x, w)), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(TP)), out_specs=P())(x, router, w)


def _owned_where(top_idx, gates, lo, n):
    owned = lo + jnp.arange(n)
    return jnp.sum(jnp.where(top_idx[:, :, None] == owned, gates[:, :, None], 0.0), axis=1)


def weighted_pick_ep(x, router, w, *, mesh):  # sum(where(top_idx == owned, gates, 0)) over the k picks
    return _weighted_pick_ep(x, router, w, mesh, _owned_where)


def weighted_pick_ep_one_hot(x, router, w, *, mesh):  # einsum of the gates with one_hot(top_idx - lo)
    return _weighted_pick_ep(
        x, router, w, mesh, lambda i, g, lo, n: jnp.einsum("nk,nke->ne", g, jax.nn.one_hot(i - lo, n, dtype=g.dtype))
    )


def weighted_pick_ep_next_shard(x, router, w, *, mesh):
    # BUG: each device claims the next device's experts
    return _weighted_pick_ep(x, router, w, mesh, lambda i, g, lo, n: _owned_where(i, g, lo + n, n))


def weighted_pick_ep_ge(x, router, w, *, mesh):
    def local(top_idx, gates, lo, n):
        owned = lo + jnp.arange(n)
        # BUG: `>=` for `==`: an expert takes the gates of every pick at or past it
        return jnp.sum(jnp.where(top_idx[:, :, None] >= owned, gates[:, :, None], 0.0), axis=1)

    return _weighted_pick_ep(x, router, w, mesh, local)


def weighted_pick_ep_first_only(x, router, w, *, mesh):
    # BUG: only the first pick's gate is kept
    return _weighted_pick_ep(x, router, w, mesh, lambda i, g, lo, n: _owned_where(i[:, :1], g[:, :1], lo, n))


# --- running sums over each token group's tokens, the groups sharded: translate/cumsums.py, windows.py
def group_inputs():
    return (spec(4, S * 2, D), spec(D, EXPERTS))


def _queue_positions(x, router, inclusive=False, axis=1):
    """Each token's position in its expert's queue within its group (capacity routing)."""
    first = jax.nn.one_hot(jnp.argmax(jax.nn.softmax(x @ router, axis=-1), -1), EXPERTS, dtype=x.dtype)
    return jnp.cumsum(first, axis=axis) - (0.0 if inclusive else first)


def queue_positions(x, router):
    return _queue_positions(x, router)


def _queue_positions_dp(x, router, mesh, **kw):
    return jax.shard_map(lambda x, r: _queue_positions(x, r, **kw), mesh=mesh, in_specs=(P(TP), P()),
                         out_specs=P(TP))(x, router)


def queue_positions_dp(x, router, *, mesh):  # groups over tp, each device's groups on their own
    return _queue_positions_dp(x, router, mesh)


def queue_positions_dp_inclusive(x, router, *, mesh):
    # BUG: an inclusive running sum where the reference's is exclusive
    return _queue_positions_dp(x, router, mesh, inclusive=True)


def queue_positions_dp_across_groups(x, router, *, mesh):
    # BUG: summed over the device's groups, not over each group's tokens
    return _queue_positions_dp(x, router, mesh, axis=0)


# --- sorted dispatch of tokens held in groups, one group per data shard (translate/permutations.py) ---
def _grouped_sorted(xg, router, w1, w2, bug=None):
    """Top-1 sorted dispatch of tokens held as [groups, tokens, d]; the group sizes are a one-hot
    summed over the groups and the tokens, as library MoE layers count them. A data shard holds one
    group, so its count sums over a size-1 dim the reference's sums over all groups."""
    expert = jnp.argmax(xg @ router, axis=-1)
    counts = jax.nn.one_hot(expert, SORT_E, dtype=jnp.int32).sum(axis=(0, 1))
    order = jnp.argsort(expert.reshape(-1), stable=True)
    ends = jnp.cumsum(counts)
    starts = ends if bug == "starts-at-ends" else ends - counts
    rows = jnp.arange(order.shape[0])[None, :]
    mask = (rows >= starts[:, None]) & (rows < ends[:, None])
    h = jax.nn.relu(jnp.einsum("td,edf->etf", xg.reshape(-1, xg.shape[-1])[order], w1))
    ys = jnp.sum(jnp.einsum("etf,efd->etd", h, w2) * mask[:, :, None], axis=0)
    return ys[jnp.argsort(order)].reshape(xg.shape)


def grouped_sorted(xg, router, w1, w2):
    return _grouped_sorted(xg, router, w1, w2)


def grouped_sorted_inputs():
    return (spec(2, SORT_T // 2, D), spec(D, SORT_E), spec(SORT_E, D, SORT_F), spec(SORT_E, SORT_F, D))


def grouped_sorted_dp(xg, router, w1, w2, *, mesh):
    return jax.shard_map(_grouped_sorted, mesh=mesh, in_specs=(P(TP), P(), P(), P()), out_specs=P(TP))(xg, router, w1, w2)


def grouped_sorted_dp_starts_at_ends(xg, router, w1, w2, *, mesh):
    # BUG: each expert's rows start where its group ends
    return jax.shard_map(lambda *a: _grouped_sorted(*a, bug="starts-at-ends"), mesh=mesh,
                         in_specs=(P(TP), P(), P(), P()), out_specs=P(TP))(xg, router, w1, w2)
# --- attention scores scaled and masked in other forms than the reference's ---------------------
# translate/reciprocals.py: `* HD ** -0.5` is the f32 division by sqrt(HD) (the constant is the
# rounded reciprocal, both ways); translate/elementwise.py: where(triu(k=1), -big, s) is
# where(tril, s, -big); terms/load.py: a slot of the fused projection squeezed and transposed out
# of the dot's order (Falcon's grouped layout)
AT_B, AT_S, AT_D, AT_H, AT_HD = 2, 4, 8, 4, 8
NEG_BIG = -1e30


def attention_inputs():
    return (spec(AT_D, AT_H, AT_HD), spec(AT_D, AT_H, AT_HD), spec(AT_D, AT_H, AT_HD), spec(AT_B, AT_S, AT_D))


def _scores(wq, wk, x):
    q, k = (jnp.einsum("bsd,dhe->bhse", x, w) for w in (wq, wk))
    return jnp.einsum("bhqe,bhke->bhqk", q, k)


def attention(wq, wk, wv, x):
    s = _scores(wq, wk, x) / jnp.sqrt(float(AT_HD))
    s = jnp.where(jnp.tril(jnp.ones((AT_S, AT_S), bool)), s, NEG_BIG)
    return jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), jnp.einsum("bsd,dhe->bshe", x, wv))


def _attention_tp(wq, wk, wv, x, mesh, scaled, masked):
    def body(wq, wk, wv, x):
        s = masked(scaled(_scores(wq, wk, x)))
        return jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), jnp.einsum("bsd,dhe->bshe", x, wv))

    w = P(None, TP, None)
    return jax.shard_map(body, mesh=mesh, in_specs=(w, w, w, P()), out_specs=P(None, None, TP))(wq, wk, wv, x)


def _masked_above(s):  # the keys past each query set to -big: where(triu(k=1), -big, s)
    return jnp.where(jnp.triu(jnp.ones((AT_S, AT_S), bool), k=1), NEG_BIG, s)


def attention_tp(wq, wk, wv, x, *, mesh):
    return _attention_tp(wq, wk, wv, x, mesh, lambda s: s * AT_HD ** -0.5, _masked_above)


def attention_tp_positions(wq, wk, wv, x, *, mesh):  # 1 / sqrt(HD) in Python, the mask from positions
    def masked(s):
        pos = jnp.arange(AT_S)
        return jnp.where(pos[None, :] > pos[:, None], NEG_BIG, s)

    return _attention_tp(wq, wk, wv, x, mesh, lambda s: s * (1.0 / math.sqrt(AT_HD)), masked)


def attention_tp_scaled_twice(wq, wk, wv, x, *, mesh):
    return _attention_tp(wq, wk, wv, x, mesh, lambda s: s * AT_HD ** -0.5 * AT_HD ** -0.5, _masked_above)  # BUG


def attention_tp_diagonal(wq, wk, wv, x, *, mesh):
    def masked(s):  # BUG: triu(k=0) masks each query's own key too
        return jnp.where(jnp.triu(jnp.ones((AT_S, AT_S), bool)), NEG_BIG, s)

    return _attention_tp(wq, wk, wv, x, mesh, lambda s: s * AT_HD ** -0.5, masked)


def attention_tp_kept_below(wq, wk, wv, x, *, mesh):
    def masked(s):  # BUG: the causal mask's keys get -big (tril where triu belongs)
        return jnp.where(jnp.tril(jnp.ones((AT_S, AT_S), bool)), NEG_BIG, s)

    return _attention_tp(wq, wk, wv, x, mesh, lambda s: s * AT_HD ** -0.5, masked)


# A scale c and its neighbour c' one ulp below: 1 / c and 1 / c' round to the same f32 q, but only c
# is the rounded 1 / q (the round trip back that keeps distinct products apart)
SCALE_C = 1.9
SCALE_NUDGED = float(np.nextafter(np.float32(SCALE_C), np.float32(0)))


def tanh_scaled_inputs():
    return (spec(B, D), spec(D, 2 * D))


def tanh_scaled(x, w):
    return jnp.tanh((x @ w) * SCALE_C)


def _tanh_scaled_tp(x, w, mesh, scale):
    return jax.shard_map(lambda x, w: jnp.tanh((x @ w) * scale), mesh=mesh, in_specs=(P(), P(None, TP)),
                         out_specs=P(None, TP))(x, w)


def tanh_scaled_tp(x, w, *, mesh):
    return _tanh_scaled_tp(x, w, mesh, SCALE_C)


def tanh_scaled_tp_nudged(x, w, *, mesh):
    return _tanh_scaled_tp(x, w, mesh, SCALE_NUDGED)  # BUG: one ulp below the reference's scale


# Falcon's grouped layout: per KV group its G query heads, its key head, its value head
FA_KV, FA_G = 4, 2  # two KV groups a device


def falcon_inputs():
    return (spec(AT_D, FA_KV * (FA_G + 2) * AT_HD), spec(AT_B, AT_S, AT_D))


def _causal(s):
    return jnp.where(jnp.tril(jnp.ones((AT_S, AT_S), bool)), s, NEG_BIG)


def falcon(w, x):
    fused = (x @ w).reshape(AT_B, AT_S, FA_KV, FA_G + 2, AT_HD)
    q, k, v = fused[..., :FA_G, :], fused[..., FA_G, :], fused[..., FA_G + 1, :]
    s = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / jnp.sqrt(float(AT_HD))
    ctx = jnp.einsum("bkgqs,bskd->bqkgd", jax.nn.softmax(_causal(s), axis=-1), v)
    return ctx.reshape(AT_B, AT_S, FA_KV * FA_G * AT_HD)


def _falcon_tp(w, x, mesh, group_major):
    def body(w, x):
        kv = w.shape[1] // ((FA_G + 2) * AT_HD)
        if group_major:
            fused = (x @ w).reshape(AT_B, AT_S, kv, FA_G + 2, AT_HD)
        else:  # BUG: the slots read slot-major, [G + 2, kv] where the columns are [kv, G + 2]
            fused = (x @ w).reshape(AT_B, AT_S, FA_G + 2, kv, AT_HD).swapaxes(2, 3)
        q = fused[:, :, :, :FA_G].transpose(0, 2, 3, 1, 4)
        k, v = (fused[:, :, :, t].transpose(0, 2, 1, 3) for t in (FA_G, FA_G + 1))
        s = lax.dot_general(q, k, (((4,), (3,)), ((0, 1), (0, 1)))) * AT_HD ** -0.5
        ctx = lax.dot_general(jax.nn.softmax(_causal(s), axis=-1), v, (((4,), (2,)), ((0, 1), (0, 1))))
        return ctx.transpose(0, 3, 1, 2, 4).reshape(AT_B, AT_S, kv * FA_G * AT_HD)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP), P()), out_specs=P(None, None, TP))(w, x)


def falcon_tp(w, x, *, mesh):
    return _falcon_tp(w, x, mesh, group_major=True)


def falcon_tp_slot_major(w, x, *, mesh):
    return _falcon_tp(w, x, mesh, group_major=False)
# --- a flat parameter's gradient cut back into the weights' rows: terms/rules/layouts.py (reshape_undone)
FLAT_ROWS, FLAT_IN, FLAT_HID = 8, 4, 8  # batch, width, hidden


def flat_param_inputs():
    return ({"w_in": spec(FLAT_IN, FLAT_HID), "w_out": spec(FLAT_HID, FLAT_IN)}, spec(FLAT_ROWS, FLAT_IN))


def _flat_mse(w_in, w_out, x):
    return jnp.mean(jnp.square(jnp.tanh(x @ w_in) @ w_out - x))


def flat_grads(params, x):
    return jax.grad(lambda p: _flat_mse(p["w_in"], p["w_out"], x))(params)


def _unflatten(flat, start=0):
    cut = FLAT_IN * FLAT_HID
    return flat[:cut].reshape(FLAT_IN, FLAT_HID), flat[start + cut:start + 2 * cut].reshape(FLAT_HID, FLAT_IN)


def _flat_fsdp_gathered(params, x, mesh, start=0):
    """HSDP with a torch-FSDP-style flat parameter: one flat buffer sharded over tp and replicated over
    `replica`, all-gathered inside the differentiated loss (its gradient comes back reduce-scattered
    over tp), then summed over `replica`; cut and reshaped into the weights outside."""
    flat = jnp.concatenate([params["w_in"].ravel(), params["w_out"].ravel(), jnp.zeros(4 * start, F32)])

    def body(shard, x):
        def loss(shard):
            w_in, w_out = _unflatten(lax.all_gather(shard, TP, tiled=True), start)
            return jnp.sum(jnp.square(jnp.tanh(x @ w_in) @ w_out - x)) / (FLAT_ROWS * FLAT_IN)

        return lax.psum(jax.grad(loss)(shard), "replica")

    grad = jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P(("replica", TP))), out_specs=P(TP),
                         check_vma=False)(flat, x)
    w_in, w_out = _unflatten(grad, start)
    return {"w_in": w_in, "w_out": w_out}


def flat_fsdp_grads(params, x, *, mesh):
    return _flat_fsdp_gathered(params, x, mesh)


def flat_fsdp_grads_off_by_one(params, x, *, mesh):
    # BUG: the second weight is cut one element late from the flat buffer
    return _flat_fsdp_gathered(params, x, mesh, start=1)


def flat_fsdp_scattered(params, x, *, mesh):
    """The other style: each device differentiates with the whole weights, ravels and concatenates its
    gradients, reduce-scatters the flat buffer over tp with psum_scatter and sums it over `replica`;
    split back by jnp.split."""

    def body(params, x):
        g = jax.grad(lambda p: jnp.sum(jnp.square(jnp.tanh(x @ p["w_in"]) @ p["w_out"] - x)))(params)
        flat = jnp.concatenate([g["w_in"].ravel(), g["w_out"].ravel()]) / (FLAT_ROWS * FLAT_IN)
        return lax.psum(lax.psum_scatter(flat, TP, tiled=True), "replica")

    flat = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(("replica", TP))), out_specs=P(TP),
                         check_vma=False)(params, x)
    w_in, w_out = jnp.split(flat, 2)
    return {"w_in": w_in.reshape(FLAT_IN, FLAT_HID), "w_out": w_out.reshape(FLAT_HID, FLAT_IN)}


# --- a negated mean loss per data shard, then averaged: translate/collectives.py (negated shares) --
def neg_loss_inputs():
    return (spec(8, D), spec(D, V), spec(8, dtype=jnp.int32))


def _label_log_probs(x, w, labels):
    logp = jax.nn.log_softmax(x @ w, axis=-1)
    return jnp.take_along_axis(logp, labels[:, None], axis=-1)


def neg_loss(x, w, labels):
    return -jnp.mean(_label_log_probs(x, w, labels))


def _neg_loss_dp(x, w, labels, mesh, local, reduce):
    return jax.shard_map(lambda x, w, y: reduce(local(x, w, y)), mesh=mesh, in_specs=(P(TP), P(), P(TP)),
                         out_specs=P())(x, w, labels)


def neg_loss_dp(x, w, labels, *, mesh):
    return _neg_loss_dp(x, w, labels, mesh, neg_loss, lambda t: lax.pmean(t, TP))


def neg_loss_dp_summed_shares(x, w, labels, *, mesh):
    """The other style: each shard's negated sum over the global batch size, psummed."""
    return _neg_loss_dp(x, w, labels, mesh, lambda x, w, y: -jnp.sum(_label_log_probs(x, w, y)) / x.shape[0] / 2,
                        lambda t: lax.psum(t, TP))


def neg_loss_dp_psum(x, w, labels, *, mesh):
    # BUG: the shards' mean losses are summed, not averaged (the 1/n missing)
    return _neg_loss_dp(x, w, labels, mesh, neg_loss, lambda t: lax.psum(t, TP))


def mean_log_likelihood(x, w, labels):
    return jnp.mean(_label_log_probs(x, w, labels))


# neg-loss-dp-sign: neg_loss_dp against mean_log_likelihood (BUG: the shards' losses are negated, the
# reference's is not): the negation must stay on the sum


# --- FSDP gradients accumulated over microbatches in a scan: each microbatch's gradient is already
# reduce-scattered (the gather's transpose), the microbatch count divided out after the loop ---------
MICRO = 2


def fsdp_scan_inputs():
    return ({"w1": spec(FLAT_IN * 2, FLAT_HID), "w2": spec(FLAT_HID, FLAT_IN * 2)}, spec(FLAT_ROWS, FLAT_IN * 2))


def _scan_mse(w, x):
    return jnp.mean(jnp.square(jnp.tanh(x @ w["w1"]) @ w["w2"] - x))


def fsdp_scan_grads(params, x):
    return jax.grad(_scan_mse)(params, x)


def _fsdp_scan(params, x, mesh, scale_inside=False, count=MICRO, after=True, first_only=False):
    def body(local, x):
        def loss(local, xs):
            return _scan_mse(jax.tree.map(lambda w: lax.all_gather(w, TP, axis=0, tiled=True), local), xs)

        def step(total, batch):
            xs, i = batch
            g = jax.grad(loss)(local, xs)
            if scale_inside:
                scale = jnp.where(i == 0, 1.0 / count, 1.0) if first_only else 1.0 / count
                g = jax.tree.map(lambda t: t * scale, g)
            return jax.tree.map(jnp.add, total, g), None

        micro = (x.reshape(MICRO, -1, x.shape[-1]), jnp.arange(MICRO))
        grads, _ = lax.scan(step, jax.tree.map(jnp.zeros_like, local), micro)
        grads = jax.tree.map(lambda t: t / count, grads) if after else grads
        return jax.tree.map(lambda t: t / lax.axis_size(TP), grads)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P(TP)), out_specs=P(TP), check_vma=False)(params, x)


def fsdp_scan(params, x, *, mesh):
    return _fsdp_scan(params, x, mesh)


def fsdp_scan_scaled_inside(params, x, *, mesh):
    """The other style: each microbatch's gradient divided by the count inside the scan."""
    return _fsdp_scan(params, x, mesh, scale_inside=True, after=False)


def fsdp_scan_count_twice(params, x, *, mesh):
    # BUG: the microbatch count divided out inside the scan and again after it
    return _fsdp_scan(params, x, mesh, scale_inside=True)


def fsdp_scan_first_scaled(params, x, *, mesh):
    # BUG: only the first microbatch's gradient is divided by the count
    return _fsdp_scan(params, x, mesh, scale_inside=True, after=False, first_only=True)


def fsdp_scan_count_missing(params, x, *, mesh):
    # BUG: the microbatch count is never divided out
    return _fsdp_scan(params, x, mesh, count=1)
# ---- top-k written as a sort: argsort(-p)[:, :k] meets top_k(p) (translate/sorts.py, picks.sorted_pick) ----


def combine_inputs():
    return (spec(S * 2, D), spec(D, EXPERTS))


def topk_combine(x, router):
    """The top-2 gates of every token written into its experts' columns (a scatter-add)."""
    gates, top_idx = lax.top_k(jax.nn.softmax(x @ router, axis=-1), TOP)
    return jnp.zeros((x.shape[0], EXPERTS)).at[jnp.arange(x.shape[0])[:, None], top_idx].add(gates)


def _sorted_combine(x, router, mesh, top_of):
    """Expert columns over tp: each device's columns as an einsum of the gates with its one-hot,
    the top-2 taken by `top_of(probs)` (indices), the gates picked there."""

    def body(x, router):
        n = EXPERTS // lax.axis_size(TP)
        probs = jax.nn.softmax(x @ router, axis=-1)
        top_idx = top_of(probs)
        gates = jnp.take_along_axis(probs, top_idx, axis=-1)
        return jnp.einsum("tk,tke->te", gates, jax.nn.one_hot(top_idx - lax.axis_index(TP) * n, n))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P(None, TP))(x, router)


def _positions(p):
    return lax.broadcasted_iota(jnp.int32, p.shape, 1)


def argsort_combine(x, router, *, mesh):
    return _sorted_combine(x, router, mesh, lambda p: jnp.argsort(-p, axis=-1)[:, :TOP])


def sort_pairs_combine(x, router, *, mesh):  # lax.sort of (-p, positions), keyed by -p alone
    return _sorted_combine(x, router, mesh, lambda p: lax.sort((-p, _positions(p)), dimension=1, num_keys=1)[1][:, :TOP])


def argsort_combine_bottom_k(x, router, *, mesh):
    # BUG: argsort without the negation: the two least likely experts
    return _sorted_combine(x, router, mesh, lambda p: jnp.argsort(p, axis=-1)[:, :TOP])


def argsort_combine_k_off(x, router, *, mesh):
    # BUG: the second and third experts, the window one off
    return _sorted_combine(x, router, mesh, lambda p: jnp.argsort(-p, axis=-1)[:, 1 : TOP + 1])


# --- a token's own expert kernels gathered, w[idx], in a dot batched over the tokens: the gather of
# the dense per-expert dot (translate/gathered_dots.py); the k choices added one by one: the dot over
# the choices (translate/unrolled_picks.py)
def gathered_inputs():
    return (spec(S * 2, D), spec(D, EXPERTS), spec(EXPERTS, D, D), spec(EXPERTS, D, D), spec(EXPERTS, D, D))


def _top2(x, router):
    top_p, top_idx = lax.top_k(jax.nn.softmax(x @ router, axis=-1), TOP)
    return top_p / jnp.sum(top_p, axis=-1, keepdims=True), top_idx


def _gathered_choices(x, router, w1, v1, w2, up_at=lambda e: e, down_at=lambda e: e):
    """Each of the top-2 choices: the token's kernels gathered at its expert (`up_at`, `down_at`:
    the indices the up-projection and the down-projection read), weighted and added in a loop."""
    gates, top_idx = _top2(x, router)
    out = jnp.zeros_like(x)
    for j in range(TOP):
        e = top_idx[:, j]
        h = jax.nn.silu(jnp.einsum("td,tdf->tf", x, w1[e])) * jnp.einsum("td,tdf->tf", x, v1[up_at(e)])
        out = out + gates[:, j : j + 1] * jnp.einsum("tf,tfd->td", h, w2[down_at(e)])
    return out


def gathered_moe(x, router, w1, v1, w2):
    return _gathered_choices(x, router, w1, v1, w2)


def gathered_moe_take(x, router, w1, v1, w2):
    """The same with `jnp.take` and a vmapped per-token product, the choices summed in reverse."""
    gates, top_idx = _top2(x, router)
    row_times = jax.vmap(lambda row, kernel: row @ kernel)
    out = 0.0
    for j in reversed(range(TOP)):
        e = top_idx[:, j]
        h = jax.nn.silu(row_times(x, jnp.take(w1, e, axis=0))) * row_times(x, jnp.take(v1, e, axis=0))
        out = row_times(h, jnp.take(w2, e, axis=0)) * gates[:, j][:, None] + out
    return out


def dense_moe(x, router, w1, v1, w2):
    """Every expert on every token, combined with the top-2 gates' one-hot."""
    gates, top_idx = _top2(x, router)
    combine = jnp.sum(jax.nn.one_hot(top_idx, EXPERTS) * gates[..., None], axis=1)
    h = jax.nn.silu(jnp.einsum("td,edf->etf", x, w1)) * jnp.einsum("td,edf->etf", x, v1)
    return jnp.einsum("te,etd->td", combine, jnp.einsum("etf,efd->etd", h, w2))


def _gathered_ep(x, router, w1, v1, w2, mesh, offset_of):
    """Experts over tp, tokens on every device: its experts' columns of the combine (from
    `offset_of(device)`), its experts on every token, psummed."""

    def body(x, router, w1, v1, w2):
        n = w1.shape[0]
        gates, top_idx = _top2(x, router)
        combine = jnp.sum(jax.nn.one_hot(top_idx, EXPERTS) * gates[..., None], axis=1)
        mine = lax.dynamic_slice_in_dim(combine, offset_of(lax.axis_index(TP), n), n, axis=1)
        h = jax.nn.silu(jnp.einsum("td,edf->etf", x, w1)) * jnp.einsum("td,edf->etf", x, v1)
        return lax.psum(jnp.einsum("te,etd->td", mine, jnp.einsum("etf,efd->etd", h, w2)), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(TP), P(TP), P(TP)), out_specs=P())(
        x, router, w1, v1, w2
    )


def gathered_moe_ep(x, router, w1, v1, w2, *, mesh):
    return _gathered_ep(x, router, w1, v1, w2, mesh, lambda i, n: i * n)


def gathered_moe_ep_next_shard(x, router, w1, v1, w2, *, mesh):
    # BUG: each device weighs its experts by the next device's columns of the combine
    return _gathered_ep(x, router, w1, v1, w2, mesh, lambda i, n: ((i + 1) % 2) * n)


def _gathered_dp(x, router, w1, v1, w2, mesh, **at):
    """Tokens over tp, every kernel on every device: each gathers its tokens' kernels."""
    body = lambda x, router, w1, v1, w2: _gathered_choices(x, router, w1, v1, w2, **at)  # noqa: E731
    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P(), P(), P(), P()), out_specs=P(TP))(
        x, router, w1, v1, w2
    )


def gathered_moe_dp(x, router, w1, v1, w2, *, mesh):
    return _gathered_dp(x, router, w1, v1, w2, mesh)


def gathered_moe_dp_next_expert(x, router, w1, v1, w2, *, mesh):
    # BUG: the down-projection reads the next expert's kernel
    return _gathered_dp(x, router, w1, v1, w2, mesh, down_at=lambda e: (e + 1) % EXPERTS)


def gathered_moe_dp_other_choice(x, router, w1, v1, w2, *, mesh):
    # BUG: the up-projection's kernel is the other choice's (gathered at another index than w1's)
    def body(x, router, w1, v1, w2):
        gates, top_idx = _top2(x, router)
        out = jnp.zeros_like(x)
        for j in range(TOP):
            e, other = top_idx[:, j], top_idx[:, 1 - j]
            h = jax.nn.silu(jnp.einsum("td,tdf->tf", x, w1[e])) * jnp.einsum("td,tdf->tf", x, v1[other])
            out = out + gates[:, j : j + 1] * jnp.einsum("tf,tfd->td", h, w2[e])
        return out

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P(), P(), P(), P()), out_specs=P(TP))(
        x, router, w1, v1, w2
    )


# --- a table computed from constants in bfloat16 against the reference's float32 one ---------------
def table_inputs():
    return (spec(8, 16),)


def scaled_by_table(x):
    return x * (jnp.arange(16, dtype=F32) * jnp.float32(0.1))


def scaled_by_iota_table(x):
    return x * (lax.iota(F32, 16) * jnp.float32(0.1))


def _scaled_tp(x, mesh, table):
    return jax.shard_map(lambda x: x * table().astype(F32), mesh=mesh, in_specs=P(TP), out_specs=P(TP))(x)


def scaled_by_table_bf16(x, *, mesh):
    # BUG: the table is computed in bfloat16 (0.1 * i rounded to 8 bits of mantissa): up to 0.4 % off
    return _scaled_tp(x, mesh, lambda: jnp.arange(16, dtype=jnp.bfloat16) * jnp.bfloat16(0.1))


def scaled_by_iota_table_bf16(x, *, mesh):
    # BUG: as above, the table made by an iota the program runs (not folded by JAX at trace time)
    return _scaled_tp(x, mesh, lambda: lax.iota(jnp.bfloat16, 16) * jnp.bfloat16(0.1))


def scaled_by_iota_sum(x):
    return x * (lax.iota(F32, 16) + jnp.float32(255))


def scaled_by_iota_sum_bf16(x, *, mesh):
    # BUG: 255 + i in bfloat16 (exact operands, inexact sums from 256 on: 8 bits of mantissa)
    return _scaled_tp(x, mesh, lambda: lax.iota(jnp.bfloat16, 16) + jnp.bfloat16(255))
