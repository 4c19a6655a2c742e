"""Bidirectional encoder attention with two kinds of positions: a learned absolute embedding
indexed by `offset + t` (offset is an int input: the first position of this chunk of a longer
document) and a Shaw-style clipped relative bias, a per-head scalar looked up at
clip(key - query, -K, K). Queries are split over a sequence axis; keys/values are all-gathered.

- `encoder_sp`: shard_map on {sp: 4};
- `encoder_dp_sp`: on {dp: 2, sp: 2}, batch over dp.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, K, MAXPOS = 2, 16, 16, 2, 8, 3, 40


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return (f(MAXPOS, D), f(2 * K + 1, H), f(D, H, HD), f(D, H, HD), f(D, H, HD), f(B, T, D),
            jax.ShapeDtypeStruct((), jnp.int32))


def _attend(x_q, x_kv, dist, rel_table, wq, wk, wv):
    q = jnp.einsum("btd,dhk->bhtk", x_q, wq)
    k = jnp.einsum("btd,dhk->bhtk", x_kv, wk)
    v = jnp.einsum("btd,dhk->bhtk", x_kv, wv)
    rel = jnp.clip(dist, -K, K) + K
    bias = jnp.transpose(rel_table[rel], (2, 0, 1))                   # [H, q, k]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(HD) + bias
    return jnp.einsum("bhqk,bhkd->bqhd", jax.nn.softmax(s, -1), v).reshape(x_q.shape[0], -1, H * HD)


def encoder(pos_table, rel_table, wq, wk, wv, x, offset):
    pos = offset + jnp.arange(T)
    x = x + pos_table[pos]
    t = jnp.arange(T)
    return _attend(x, x, t[None, :] - t[:, None], rel_table, wq, wk, wv)


def _chunk_start(c):
    return lax.axis_index("sp") * c


def _chunk_start_global_length(c):
    return lax.axis_index("sp") * T


def _local(pos_table, rel_table, wq, wk, wv, x, offset, start, reversed_rel):
    c = x.shape[1]
    t = start(c) + jnp.arange(c)
    x = x + pos_table[offset + t]
    x_all = lax.all_gather(x, "sp", axis=1, tiled=True)
    if reversed_rel:
        return _attend(x, x_all, t[:, None] - jnp.arange(T)[None, :], rel_table, wq, wk, wv)
    return _attend(x, x_all, jnp.arange(T)[None, :] - t[:, None], rel_table, wq, wk, wv)


def _run(args, mesh, batch, start=_chunk_start, reversed_rel=False):
    local = lambda *a: _local(*a, start, reversed_rel)
    xs = P(batch, "sp")
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P(), P(), P(), P(), P(), xs, P()), out_specs=xs)(*args)


def encoder_sp(pos_table, rel_table, wq, wk, wv, x, offset, mesh):
    return _run((pos_table, rel_table, wq, wk, wv, x, offset), mesh, None)


def encoder_sp_reversed_distance(pos_table, rel_table, wq, wk, wv, x, offset, mesh):
    return _run((pos_table, rel_table, wq, wk, wv, x, offset), mesh, None, reversed_rel=True)


def encoder_dp_sp(pos_table, rel_table, wq, wk, wv, x, offset, mesh):
    return _run((pos_table, rel_table, wq, wk, wv, x, offset), mesh, "dp")


def encoder_dp_sp_global_stride(pos_table, rel_table, wq, wk, wv, x, offset, mesh):
    return _run((pos_table, rel_table, wq, wk, wv, x, offset), mesh, "dp", start=_chunk_start_global_length)
