"""Transformer-XL style input layer: sinusoidal position encodings computed on the fly from
positions, added to the token features, followed by a position-wise MLP. The sequence-parallel
version builds its positions from iota and the shard index."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

SEQ, DIM, HID = 32, 8, 16
N_SP = 4


def sinusoid(pos, dim):
    inv = 1.0 / (100.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    ang = pos.astype(jnp.float32)[:, None] * inv[None, :]
    return jnp.concatenate([jnp.sin(ang), jnp.cos(ang)], axis=-1)


def input_layer(x, w1, w2):
    h = x + sinusoid(lax.iota(jnp.int32, SEQ), DIM)
    return h + jnp.maximum(h @ w1, 0.0) @ w2


def input_layer_sp(x, w1, w2):
    chunk = SEQ // N_SP

    def local(x, w1, w2):
        pos = lax.axis_index("sp") * chunk + lax.iota(jnp.int32, chunk)
        h = x + sinusoid(pos, DIM)
        return h + jnp.maximum(h @ w1, 0.0) @ w2

    return jax.shard_map(local, in_specs=(P("sp"), P(), P()), out_specs=P("sp"))(x, w1, w2)


def input_layer_sp_global_stride(x, w1, w2):
    chunk = SEQ // N_SP

    def local(x, w1, w2):
        pos = lax.axis_index("sp") * SEQ + lax.iota(jnp.int32, chunk)
        h = x + sinusoid(pos, DIM)
        return h + jnp.maximum(h @ w1, 0.0) @ w2

    return jax.shard_map(local, in_specs=(P("sp"), P(), P()), out_specs=P("sp"))(x, w1, w2)


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((SEQ, DIM), f), jax.ShapeDtypeStruct((DIM, HID), f),
            jax.ShapeDtypeStruct((HID, DIM), f))
