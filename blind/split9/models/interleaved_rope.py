"""GPT-J style interleaved rotary embedding with explicit per-token positions (packed sequences).

The sharded version is plain jit code: inputs and output are pinned to (batch over dp, heads over
tp) with with_sharding_constraint and XLA's partitioner does the rest. It computes the rotation with
strided even/odd slices instead of a pair reshape.
"""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

HD = 8


def rope_args():
    return (jax.ShapeDtypeStruct((4, 6, 4, HD), jnp.float32),
            jax.ShapeDtypeStruct((4, 6), jnp.int32))


def _angles(positions):
    freqs = 10000.0 ** (-jnp.arange(HD // 2, dtype=jnp.float32) * 2.0 / HD)
    return positions[..., None, None].astype(jnp.float32) * freqs  # [b, s, 1, hd/2]


def rope_interleaved(x, positions):
    ang = _angles(positions)
    pairs = x.reshape(*x.shape[:-1], HD // 2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([a * jnp.cos(ang) - b * jnp.sin(ang), a * jnp.sin(ang) + b * jnp.cos(ang)], -1)
    return rotated.reshape(x.shape)


def _pin(mesh, t):
    return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P("dp", None, "tp", None)))


def _rope_strided(x, positions, mesh, interleave):
    x = _pin(mesh, x)
    cos, sin = jnp.cos(_angles(positions)), jnp.sin(_angles(positions))
    even, odd = x[..., 0::2], x[..., 1::2]
    return _pin(mesh, interleave(even * cos - odd * sin, even * sin + odd * cos))


def _stack_pairs(first, second):
    return jnp.stack([first, second], axis=-1).reshape(*first.shape[:-1], -1)


def _concat_halves(first, second):
    return jnp.concatenate([first, second], axis=-1)


def rope_interleaved_sharded(x, positions, mesh):
    return _rope_strided(x, positions, mesh, _stack_pairs)


def rope_interleaved_sharded_concat(x, positions, mesh):
    return _rope_strided(x, positions, mesh, _concat_halves)
