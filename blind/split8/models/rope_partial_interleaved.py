"""GPT-J style partial rotary: interleaved pairs, only the first ROT dims of each head rotate."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQLEN, HEADS, HEAD_DIM, ROT = 4, 8, 2, 8, 4
BASE = 10000.0


def rotary(x, positions):
    inv_freq = 1.0 / BASE ** (jnp.arange(0, ROT, 2, dtype=jnp.float32) / ROT)
    ang = positions[:, None].astype(jnp.float32) * inv_freq[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x_rot, x_pass = x[..., :ROT], x[..., ROT:]
    pairs = x_rot.reshape(*x_rot.shape[:-1], ROT // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return jnp.concatenate([rotated.reshape(x_rot.shape), x_pass], axis=-1)


def rotary_full(x):
    return rotary(x, jnp.arange(SEQLEN))


def rotary_inputs():
    return (jax.ShapeDtypeStruct((BATCH, SEQLEN, HEADS, HEAD_DIM), jnp.float32),)


def rotary_sharded(x):
    def body(xb):
        n = xb.shape[1]
        positions = lax.axis_index("sp") * n + jnp.arange(n)
        return rotary(xb, positions)

    return jax.shard_map(body, in_specs=P("dp", "sp"), out_specs=P("dp", "sp"))(x)


def rotary_sharded_v2(x):
    def body(xb):
        n = xb.shape[1]
        positions = lax.axis_index("dp") * n + jnp.arange(n)
        return rotary(xb, positions)

    return jax.shard_map(body, in_specs=P("dp", "sp"), out_specs=P("dp", "sp"))(x)
