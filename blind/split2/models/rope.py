"""Rotary position embeddings under context parallelism (sequence sharded over `cp`).

Positions are built with lax.iota; a sharded rank offsets them by its axis_index. Three ways to
rotate: interleaved pairs (GPT-J), half rotation (GPT-NeoX), and precomputed sin/cos tables sliced
at the rank's positions.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 16, 2, 8
MAX_POS = 32


def _angles(positions):
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD))
    return positions.astype(jnp.float32)[:, None] * inv_freq[None, :]


def rotate_interleaved(x, positions):
    """x: [b, s, h, hd]; rotates (x[2i], x[2i+1]) pairs."""
    theta = _angles(positions)[None, :, None, :]
    pairs = x.reshape(*x.shape[:-1], HD // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    out = jnp.stack([even * jnp.cos(theta) - odd * jnp.sin(theta),
                     even * jnp.sin(theta) + odd * jnp.cos(theta)], axis=-1)
    return out.reshape(x.shape)


def rotate_half(x, positions):
    """x: [b, s, h, hd]; rotates (x[i], x[i + hd/2])."""
    theta = _angles(positions)[None, :, None, :]
    cos = jnp.concatenate([jnp.cos(theta)] * 2, axis=-1)
    sin = jnp.concatenate([jnp.sin(theta)] * 2, axis=-1)
    first, second = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-second, first], axis=-1) * sin


def _causal_attention(wq, wk, wv, x, rotate):
    positions = lax.iota(jnp.int32, S)
    q = rotate(jnp.einsum("bsd,dhe->bshe", x, wq), positions)
    k = rotate(jnp.einsum("bsd,dhe->bshe", x, wk), positions)
    v = jnp.einsum("bsd,dhe->bshe", x, wv)
    logits = jnp.einsum("bqhe,bkhe->bhqk", q, k) * HD ** -0.5
    logits = jnp.where(positions[:, None] >= positions[None, :], logits, -jnp.inf)
    return jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(logits, -1), v).reshape(B, S, H * HD)


def attention_interleaved(wq, wk, wv, x):
    return _causal_attention(wq, wk, wv, x, rotate_interleaved)


def attention_half(wq, wk, wv, x):
    return _causal_attention(wq, wk, wv, x, rotate_half)


def attention_inputs():
    w = jax.ShapeDtypeStruct((D, H, HD), jnp.float32)
    return w, w, w, jax.ShapeDtypeStruct((B, S, D), jnp.float32)


def _offset_positions(chunk):
    return lax.iota(jnp.int32, chunk) + lax.axis_index("cp") * chunk


def _local_positions(chunk):
    return lax.iota(jnp.int32, chunk)


def _cp_attention(wq, wk, wv, x, mesh, rotate, positions_fn):
    """Queries stay local; keys and values are all-gathered over the sequence."""

    def local(wq, wk, wv, x_chunk):
        chunk = x_chunk.shape[1]
        q_pos = positions_fn(chunk)
        k_pos = lax.iota(jnp.int32, chunk * lax.axis_size("cp"))
        q = rotate(jnp.einsum("bsd,dhe->bshe", x_chunk, wq), q_pos)
        k = rotate(jnp.einsum("bsd,dhe->bshe", x_chunk, wk), q_pos)
        k = lax.all_gather(k, "cp", axis=1, tiled=True)
        v = lax.all_gather(jnp.einsum("bsd,dhe->bshe", x_chunk, wv), "cp", axis=1, tiled=True)
        logits = jnp.einsum("bqhe,bkhe->bhqk", q, k) * HD ** -0.5
        logits = jnp.where(q_pos[:, None] >= k_pos[None, :], logits, -jnp.inf)
        ctx = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(logits, -1), v)
        return ctx.reshape(ctx.shape[0], chunk, H * HD)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), P(None, "cp", None)),
                         out_specs=P(None, "cp", None))(wq, wk, wv, x)


def attention_interleaved_cp(wq, wk, wv, x, mesh):
    return _cp_attention(wq, wk, wv, x, mesh, rotate_interleaved, _offset_positions)


def attention_half_cp_v2(wq, wk, wv, x, mesh):
    return _cp_attention(wq, wk, wv, x, mesh, rotate_half, _local_positions)


_THETA = np.arange(MAX_POS)[:, None] / (10000.0 ** (np.arange(0, HD, 2) / HD))[None, :]
COS_TABLE = np.cos(_THETA).astype(np.float32)
SIN_TABLE = np.sin(_THETA).astype(np.float32)


def _apply_table(x, cos, sin):
    first, second = jnp.split(x, 2, axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def rotary_qk(wq, wk, x):
    q = jnp.einsum("bsd,dhe->bshe", x, wq)
    k = jnp.einsum("bsd,dhe->bshe", x, wk)
    cos, sin = jnp.asarray(COS_TABLE[:S]), jnp.asarray(SIN_TABLE[:S])
    return _apply_table(q, cos, sin), _apply_table(k, cos, sin)


def rotary_qk_inputs():
    w = jax.ShapeDtypeStruct((D, H, HD), jnp.float32)
    return w, w, jax.ShapeDtypeStruct((B, S, D), jnp.float32)


def _table_slice(table, chunk, axis_name):
    return lax.dynamic_slice_in_dim(jnp.asarray(table), lax.axis_index(axis_name) * chunk, chunk)


def rotary_qk_cp_tp(wq, wk, x, mesh):
    """Sequence over `cp`, heads over `tp`."""

    @functools.partial(jax.shard_map, mesh=mesh,
                       in_specs=(P(None, "tp", None), P(None, "tp", None), P(None, "cp", None)),
                       out_specs=(P(None, "cp", "tp", None), P(None, "cp", "tp", None)))
    def local(wq, wk, x_chunk):
        chunk = x_chunk.shape[1]
        cos = _table_slice(COS_TABLE, chunk, "cp")
        sin = _table_slice(SIN_TABLE, chunk, "cp")
        q = jnp.einsum("bsd,dhe->bshe", x_chunk, wq)
        k = jnp.einsum("bsd,dhe->bshe", x_chunk, wk)
        return _apply_table(q, cos, sin), _apply_table(k, cos, sin)

    return local(wq, wk, x)


def rotary_qk_cp_tp_v2(wq, wk, x, mesh):
    @functools.partial(jax.shard_map, mesh=mesh,
                       in_specs=(P(None, "tp", None), P(None, "tp", None), P(None, "cp", None)),
                       out_specs=(P(None, "cp", "tp", None), P(None, "cp", "tp", None)))
    def local(wq, wk, x_chunk):
        chunk = x_chunk.shape[1]
        cos = _table_slice(COS_TABLE, chunk, "cp")
        sin = _table_slice(SIN_TABLE, chunk, "tp")
        q = jnp.einsum("bsd,dhe->bshe", x_chunk, wq)
        k = jnp.einsum("bsd,dhe->bshe", x_chunk, wk)
        return _apply_table(q, cos, sin), _apply_table(k, cos, sin)

    return local(wq, wk, x)
