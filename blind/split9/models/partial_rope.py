"""Partial rotary embedding (NeoX half-rotation on the first ROT_DIMS of each head) from a
precomputed cos/sin table, applied at `start_pos` (continuation of a prompt); the parallel version
shards the sequence and slices the table for its block with lax.dynamic_slice_in_dim.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

MAX_POS, HEAD_DIM, ROT_DIMS = 64, 16, 8


def _tables():
    inv = 1.0 / (10000.0 ** (jnp.arange(0, ROT_DIMS, 2, dtype=jnp.float32) / ROT_DIMS))
    ang = jnp.arange(MAX_POS, dtype=jnp.float32)[:, None] * inv[None, :]
    return jnp.cos(ang), jnp.sin(ang)  # [MAX_POS, ROT_DIMS // 2]


def rope_inputs():
    return (jax.ShapeDtypeStruct((2, 16, 4, HEAD_DIM), jnp.float32),
            jax.ShapeDtypeStruct((), jnp.int32))


def _rotate(x_rot, cos, sin):
    x1, x2 = jnp.split(x_rot, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def apply_partial_rope(x, start_pos):
    cos_t, sin_t = _tables()
    pos = start_pos + jnp.arange(x.shape[1])
    cos, sin = cos_t[pos][None, :, None, :], sin_t[pos][None, :, None, :]
    return jnp.concatenate([_rotate(x[..., :ROT_DIMS], cos, sin), x[..., ROT_DIMS:]], axis=-1)


def _first_row(start_pos, n):
    return start_pos + jax.lax.axis_index("sp") * n


def _first_row_v2(start_pos, n):
    return jax.lax.axis_index("sp") * n


def _rope_block(x_blk, start_pos, first_row=_first_row):
    cos_t, sin_t = _tables()
    n = x_blk.shape[1]
    first = first_row(start_pos, n)
    cos = jax.lax.dynamic_slice_in_dim(cos_t, first, n)[None, :, None, :]
    sin = jax.lax.dynamic_slice_in_dim(sin_t, first, n)[None, :, None, :]
    return jnp.concatenate([_rotate(x_blk[..., :ROT_DIMS], cos, sin), x_blk[..., ROT_DIMS:]], axis=-1)


def _sp(fn, mesh):
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(None, "sp"), P()), out_specs=P(None, "sp"))


def partial_rope_sp(x, start_pos, mesh):
    return _sp(_rope_block, mesh)(x, start_pos)


def partial_rope_sp_no_start(x, start_pos, mesh):
    return _sp(lambda x, s: _rope_block(x, s, _first_row_v2), mesh)(x, start_pos)
