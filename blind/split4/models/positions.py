"""Absolute positions on sequence-sharded activations, computed from iota + axis_index."""

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, L, W = 2, 16, 8


def learned_inputs():
    return (jax.ShapeDtypeStruct((N, L), jnp.int32), jax.ShapeDtypeStruct((64, W), jnp.float32),
            jax.ShapeDtypeStruct((L, W), jnp.float32))


def embed_with_positions(ids, tok_table, pos_table):
    pos = jnp.arange(L)
    return tok_table[ids] + pos_table[pos][None]


def embed_with_positions_sp(ids, tok_table, pos_table, mesh):
    def shard(ids, tok_table, pos_table):
        span = ids.shape[1]
        pos = lax.axis_index("seq") * span + lax.iota(jnp.int32, span)
        return tok_table[ids] + pos_table[pos][None]

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(None, "seq"), P(), P()),
                         out_specs=P(None, "seq"))(ids, tok_table, pos_table)


def embed_with_positions_sp_no_stride(ids, tok_table, pos_table, mesh):
    def shard(ids, tok_table, pos_table):
        span = ids.shape[1]
        pos = lax.axis_index("seq") + lax.iota(jnp.int32, span)
        return tok_table[ids] + pos_table[pos][None]

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(None, "seq"), P(), P()),
                         out_specs=P(None, "seq"))(ids, tok_table, pos_table)


def sinusoid_inputs():
    return (jax.ShapeDtypeStruct((N * 2, L, W), jnp.float32),)


def sinusoid_table(positions, width):
    i = jnp.arange(width // 2, dtype=jnp.float32)
    inv = jnp.exp(-math.log(10000.0) * 2.0 * i / width)
    ang = positions.astype(jnp.float32)[:, None] * inv[None, :]
    return jnp.concatenate([jnp.sin(ang), jnp.cos(ang)], axis=-1)


def add_sinusoid(x):
    return x * math.sqrt(W) + sinusoid_table(jnp.arange(x.shape[1]), W)[None]


def add_sinusoid_2d(x, mesh):
    """Mesh {batch, seq}: batch rows and sequence chunks both split."""

    def shard(x):
        chunk = x.shape[1]
        start = lax.axis_index("seq") * chunk
        pos = lax.broadcasted_iota(jnp.int32, (chunk,), 0) + start
        return x * math.sqrt(W) + sinusoid_table(pos, W)[None]

    return jax.shard_map(shard, mesh=mesh, in_specs=P("batch", "seq"),
                         out_specs=P("batch", "seq"))(x)


def alibi_inputs():
    return (jax.ShapeDtypeStruct((N, L, W), jnp.float32), jax.ShapeDtypeStruct((W, 3 * W), jnp.float32))


HEADS = 2


def alibi_attention(x, w):
    q, k, v = (t.reshape(N, L, HEADS, W // HEADS) for t in jnp.split(x @ w, 3, -1))
    slopes = 2.0 ** (-8.0 * jnp.arange(1, HEADS + 1) / HEADS)
    dist = jnp.arange(L)[None, :] - jnp.arange(L)[:, None]                  # key - query
    bias = slopes[:, None, None] * jnp.minimum(dist, 0)[None]
    s = jnp.einsum("nqhd,nkhd->nhqk", q, k) + bias[None]
    s = jnp.where(dist[None, None] <= 0, s, -1e9)
    return jnp.einsum("nhqk,nkhd->nqhd", jax.nn.softmax(s, -1), v).reshape(N, L, W)


def alibi_attention_sp(x, w, mesh):
    def shard(x, w):
        lq = x.shape[1]
        q, k, v = jnp.split(x @ w, 3, -1)
        k = lax.all_gather(k, "seq", axis=1, tiled=True)
        v = lax.all_gather(v, "seq", axis=1, tiled=True)
        q = q.reshape(N, lq, HEADS, W // HEADS)
        k, v = (t.reshape(N, L, HEADS, W // HEADS) for t in (k, v))
        slopes = 2.0 ** (-8.0 * jnp.arange(1, HEADS + 1) / HEADS)
        qpos = lax.axis_index("seq") * lq + jnp.arange(lq)
        dist = jnp.arange(L)[None, :] - qpos[:, None]
        bias = slopes[:, None, None] * jnp.minimum(dist, 0)[None]
        s = jnp.einsum("nqhd,nkhd->nhqk", q, k) + bias[None]
        s = jnp.where(dist[None, None] <= 0, s, -1e9)
        return jnp.einsum("nhqk,nkhd->nqhd", jax.nn.softmax(s, -1), v).reshape(N, lq, W)

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(None, "seq"), P()),
                         out_specs=P(None, "seq"))(x, w)
