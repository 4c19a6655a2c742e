"""Rotary embedding as complex multiplication (Meta Llama reference style) vs. the real-valued
cos/sin form used by the sequence-sharded implementation."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

BATCH, SEQ, HEADS, HEAD_DIM = 2, 8, 2, 8


def inputs():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, HEADS, HEAD_DIM), jnp.float32),)


def _freqs(positions):
    inv = 1.0 / (10000.0 ** (jnp.arange(0, HEAD_DIM, 2, dtype=jnp.float32) / HEAD_DIM))
    return jnp.outer(positions.astype(jnp.float32), inv)               # [S, HD/2]


def rope_complex(x):
    freqs_cis = jnp.exp(1j * _freqs(jnp.arange(SEQ)).astype(jnp.complex64))
    pairs = x.reshape(*x.shape[:-1], HEAD_DIM // 2, 2)
    xc = jax.lax.complex(pairs[..., 0], pairs[..., 1])
    out = xc * freqs_cis[None, :, None, :]
    return jnp.stack([out.real, out.imag], axis=-1).reshape(x.shape)


def rope_real_sharded(x, mesh):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, "sp")))

    def local(xs):
        n = xs.shape[1]
        ang = _freqs(jax.lax.axis_index("sp") * n + jnp.arange(n))[None, :, None, :]
        x0, x1 = xs[..., 0::2], xs[..., 1::2]
        y0 = x0 * jnp.cos(ang) - x1 * jnp.sin(ang)
        y1 = x0 * jnp.sin(ang) + x1 * jnp.cos(ang)
        return jnp.stack([y0, y1], axis=-1).reshape(xs.shape)

    y = jax.shard_map(local, mesh=mesh, in_specs=P(None, "sp"), out_specs=P(None, "sp"))(x)
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P()))
