"""Megatron sequence parallelism for a LayerNorm + MLP block.

Activations outside the tensor-parallel region are split along the sequence; the block
all-gathers the sequence before the column-parallel matmul and reduce-scatters it after the
row-parallel one.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, F = 2, 16, 16, 64


def layer_norm(x, gamma, beta, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * gamma + beta


def block(x, ln, w_fc, w_proj):
    h = layer_norm(x, ln["gamma"], ln["beta"])
    h = jax.nn.relu(lax.dot_general(h, w_fc, (((2,), (0,)), ((), ()))))
    return x + lax.dot_general(h, w_proj, (((2,), (0,)), ((), ())))


def block_inputs():
    f32 = jnp.float32
    ln = {"gamma": jax.ShapeDtypeStruct((D,), f32), "beta": jax.ShapeDtypeStruct((D,), f32)}
    return (
        jax.ShapeDtypeStruct((B, S, D), f32),
        ln,
        jax.ShapeDtypeStruct((D, F), f32),
        jax.ShapeDtypeStruct((F, D), f32),
    )


_SPECS = (P(None, "tp", None), {"gamma": P(), "beta": P()}, P(None, "tp"), P("tp", None))


def block_sp(x, ln, w_fc, w_proj, mesh):
    def region(x_chunk, ln_p, w1, w2):
        h = layer_norm(x_chunk, ln_p["gamma"], ln_p["beta"])
        h = lax.all_gather(h, "tp", axis=1, tiled=True)
        h = jax.nn.relu(lax.dot_general(h, w1, (((2,), (0,)), ((), ()))))
        h = lax.dot_general(h, w2, (((2,), (0,)), ((), ())))
        h = lax.psum_scatter(h, "tp", scatter_dimension=1, tiled=True)
        return x_chunk + h

    return jax.shard_map(region, mesh=mesh, in_specs=_SPECS, out_specs=P(None, "tp", None))(x, ln, w_fc, w_proj)


def block_sp_residual_in_region(x, ln, w_fc, w_proj, mesh):
    def region(x_chunk, ln_p, w1, w2):
        h = layer_norm(x_chunk, ln_p["gamma"], ln_p["beta"])
        full_x = lax.all_gather(x_chunk, "tp", axis=1, tiled=True)
        h = lax.all_gather(h, "tp", axis=1, tiled=True)
        h = jax.nn.relu(lax.dot_general(h, w1, (((2,), (0,)), ((), ()))))
        h = full_x + lax.dot_general(h, w2, (((2,), (0,)), ((), ())))
        return lax.psum_scatter(h, "tp", scatter_dimension=1, tiled=True)

    return jax.shard_map(region, mesh=mesh, in_specs=_SPECS, out_specs=P(None, "tp", None))(x, ln, w_fc, w_proj)
