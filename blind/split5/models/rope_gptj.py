"""GPT-J style (interleaved pairs) rotary embedding on sequence-sharded queries and keys.

Returns the rotated q.k attention logits. The sequence-parallel version computes its positions
from axis_index and all-gathers the rotated keys.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, HEADS, HEAD_DIM = 1, 8, 2, 8
BASE = 10000.0


def qk_shapes():
    s = jax.ShapeDtypeStruct((BATCH, SEQ, HEADS, HEAD_DIM), jnp.float32)
    return s, s


def rotate_interleaved(x, positions):
    inv_freq = 1.0 / BASE ** (jnp.arange(0, HEAD_DIM, 2, dtype=jnp.float32) / HEAD_DIM)
    angles = positions[:, None].astype(jnp.float32) * inv_freq[None, :]  # [S, HD/2]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    rotated = jnp.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1)
    return rotated.reshape(x.shape)


def rope_logits(q, k):
    pos = jnp.arange(SEQ)
    q, k = rotate_interleaved(q, pos), rotate_interleaved(k, pos)
    return jnp.einsum("bqhd,bkhd->bhqk", q, k)


def rope_logits_sp(q, k):
    def local(q, k):
        n = q.shape[1]
        pos = lax.axis_index("sp") * n + jnp.arange(n)
        q, k = rotate_interleaved(q, pos), rotate_interleaved(k, pos)
        k_all = lax.all_gather(k, "sp", axis=1, tiled=True)
        return jnp.einsum("bqhd,bkhd->bhqk", q, k_all)

    return jax.shard_map(local, in_specs=(P(None, "sp"), P(None, "sp")),
                         out_specs=P(None, None, "sp"))(q, k)
