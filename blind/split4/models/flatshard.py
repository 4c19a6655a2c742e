"""Fully-sharded MLP whose parameters are stored as flat 1-D buffers (one per weight)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D_MODEL, D_FF, TOKENS = 16, 32, 8


def init_shapes():
    f32 = jnp.float32
    params = {
        "w_in": jax.ShapeDtypeStruct((D_MODEL * D_FF,), f32),
        "b_in": jax.ShapeDtypeStruct((D_FF,), f32),
        "w_out": jax.ShapeDtypeStruct((D_FF * D_MODEL,), f32),
    }
    return params, jax.ShapeDtypeStruct((TOKENS, D_MODEL), f32)


def _unflatten(params):
    return (params["w_in"].reshape(D_MODEL, D_FF), params["b_in"],
            params["w_out"].reshape(D_FF, D_MODEL))


def ffn(params, x):
    w_in, b_in, w_out = _unflatten(params)
    return jax.nn.gelu(x @ w_in + b_in) @ w_out


def ffn_zero3(params, x, mesh):
    def shard_fn(flat, xs):
        full = {k: lax.all_gather(v, "data", tiled=True) for k, v in flat.items()}
        w_in, b_in, w_out = _unflatten(full)
        return jax.nn.gelu(xs @ w_in + b_in) @ w_out

    return jax.shard_map(shard_fn, mesh=mesh, in_specs=(P("data"), P("data")),
                         out_specs=P("data"))(params, x)


def ffn_zero3_transposed(params, x, mesh):
    def shard_fn(flat, xs):
        w_in = lax.all_gather(flat["w_in"], "data", tiled=True).reshape(D_MODEL, D_FF)
        b_in = lax.all_gather(flat["b_in"], "data", tiled=True)
        w_out = lax.all_gather(flat["w_out"], "data", tiled=True).reshape(D_MODEL, D_FF).T
        return jax.nn.gelu(xs @ w_in + b_in) @ w_out

    return jax.shard_map(shard_fn, mesh=mesh, in_specs=(P("data"), P("data")),
                         out_specs=P("data"))(params, x)
