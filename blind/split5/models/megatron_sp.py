"""Megatron sequence parallelism for a pre-LN MLP sublayer.

Activations outside the MLP are split along the sequence over 'model'; LayerNorm runs on the
local tokens, the sequence is all-gathered before the column-parallel matmul and the row-parallel
partial sums are reduce-scattered back to sequence shards.
"""
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, HIDDEN, FFN = 2, 8, 16, 64


def get_inputs():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, HIDDEN), f32),
            {"ln_scale": jax.ShapeDtypeStruct((HIDDEN,), f32),
             "ln_bias": jax.ShapeDtypeStruct((HIDDEN,), f32),
             "fc1": jax.ShapeDtypeStruct((HIDDEN, FFN), f32),
             "fc2": jax.ShapeDtypeStruct((FFN, HIDDEN), f32)})


def layer_norm(x, scale, bias):
    mu = x.mean(axis=-1, keepdims=True)
    sigma2 = x.var(axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(sigma2 + 1e-6) * scale + bias


def mlp_sublayer(x, p):
    h = layer_norm(x, p["ln_scale"], p["ln_bias"])
    h = jax.nn.silu(h @ p["fc1"])
    return x + h @ p["fc2"]


_P_SPECS = {"ln_scale": P(), "ln_bias": P(), "fc1": P(None, "model"), "fc2": P("model", None)}


def mlp_sublayer_sp(x, p, mesh):
    @partial(jax.shard_map, mesh=mesh, in_specs=(P(None, "model"), _P_SPECS),
             out_specs=P(None, "model"))
    def inner(x_seq, p):
        h = layer_norm(x_seq, p["ln_scale"], p["ln_bias"])
        h = lax.all_gather(h, "model", axis=1, tiled=True)
        h = jax.nn.silu(h @ p["fc1"])
        y = lax.psum_scatter(h @ p["fc2"], "model", scatter_dimension=1, tiled=True)
        return x_seq + y

    return inner(x, p)


def mlp_sublayer_sp_no_residual(x, p, mesh):
    @partial(jax.shard_map, mesh=mesh, in_specs=(P(None, "model"), _P_SPECS),
             out_specs=P(None, "model"))
    def inner(x_seq, p):
        h = layer_norm(x_seq, p["ln_scale"], p["ln_bias"])
        h = lax.all_gather(h, "model", axis=1, tiled=True)
        h = jax.nn.silu(h @ p["fc1"])
        y = lax.psum_scatter(h @ p["fc2"], "model", scatter_dimension=1, tiled=True)
        return y

    return inner(x, p)
