"""Rotary embedding (half-rotation / NeoX layout) from precomputed cos/sin tables, for a chunk of
tokens starting at a cache offset `start` (chunked prefill). Mesh {sp, tp}: the chunk's sequence is
split over 'sp' and the heads over 'tp'; each device slices the table rows of its own positions."""
import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

MAX_POS, CHUNK, HEADS, HEAD_DIM = 32, 16, 4, 8


def _tables():
    inv = 1.0 / (10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM))
    ang = np.arange(MAX_POS)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=-1)                 # [MAX_POS, HEAD_DIM]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


COS, SIN = _tables()


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(q, start):
    """q [CHUNK, HEADS, HEAD_DIM] at positions start .. start+CHUNK-1."""
    cos = lax.dynamic_slice_in_dim(jnp.asarray(COS), start, CHUNK)[:, None, :]
    sin = lax.dynamic_slice_in_dim(jnp.asarray(SIN), start, CHUNK)[:, None, :]
    return q * cos + rotate_half(q) * sin


def apply_rope_sharded(q, start):
    def local(q_blk, start):
        rows = q_blk.shape[0]
        first = start + lax.axis_index("sp") * rows
        cos = lax.dynamic_slice_in_dim(jnp.asarray(COS), first, rows)[:, None, :]
        sin = lax.dynamic_slice_in_dim(jnp.asarray(SIN), first, rows)[:, None, :]
        return q_blk * cos + rotate_half(q_blk) * sin

    return jax.shard_map(local, in_specs=(P("sp", "tp"), P()), out_specs=P("sp", "tp"))(q, start)


def apply_rope_sharded_no_start(q, start):
    def local(q_blk, start):
        rows = q_blk.shape[0]
        first = lax.axis_index("sp") * rows
        cos = lax.dynamic_slice_in_dim(jnp.asarray(COS), first, rows)[:, None, :]
        sin = lax.dynamic_slice_in_dim(jnp.asarray(SIN), first, rows)[:, None, :]
        return q_blk * cos + rotate_half(q_blk) * sin

    return jax.shard_map(local, in_specs=(P("sp", "tp"), P()), out_specs=P("sp", "tp"))(q, start)


def inputs():
    return (jax.ShapeDtypeStruct((CHUNK, HEADS, HEAD_DIM), jnp.float32),
            jax.ShapeDtypeStruct((), jnp.int32))
