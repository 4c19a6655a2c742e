"""Fully-sharded MLP blocks whose parameters live in flat 1-D buffers (ZeRO-3 style).

Each device owns a contiguous chunk of every flat buffer; weights are rebuilt right before use.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D_MODEL, D_FF, BATCH = 16, 32, 8
AXIS = "fsdp"


def _unpack(buf, rows, cols):
    return buf.reshape(rows, cols)


def mlp_block(params, x):
    w_up = _unpack(params["up"], D_MODEL, D_FF)
    w_down = _unpack(params["down"], D_FF, D_MODEL)
    h = jax.nn.gelu(x @ w_up + params["up_bias"])
    return x + h @ w_down


def mlp_block_inputs():
    f32 = jnp.float32
    params = {
        "up": jax.ShapeDtypeStruct((D_MODEL * D_FF,), f32),
        "up_bias": jax.ShapeDtypeStruct((D_FF,), f32),
        "down": jax.ShapeDtypeStruct((D_FF * D_MODEL,), f32),
    }
    return params, jax.ShapeDtypeStruct((BATCH, D_MODEL), f32)


def _materialize(chunk):
    return lax.all_gather(chunk, AXIS, axis=0, tiled=True)


def mlp_block_zero3(params, x, mesh):
    def shard_fn(p, xs):
        w_up = _materialize(p["up"]).reshape(D_MODEL, D_FF)
        bias = _materialize(p["up_bias"])
        w_down = _materialize(p["down"]).reshape(D_FF, D_MODEL)
        h = jax.nn.gelu(xs @ w_up + bias)
        return xs + h @ w_down

    specs = {"up": P(AXIS), "up_bias": P(AXIS), "down": P(AXIS)}
    return jax.shard_map(shard_fn, mesh=mesh, in_specs=(specs, P(AXIS)), out_specs=P(AXIS))(params, x)


def mlp_block_zero3_transposed(params, x, mesh):
    def shard_fn(p, xs):
        w_up = _materialize(p["up"]).reshape(D_MODEL, D_FF)
        bias = _materialize(p["up_bias"])
        w_down = _materialize(p["down"]).reshape(D_MODEL, D_FF).T
        h = jax.nn.gelu(xs @ w_up + bias)
        return xs + h @ w_down

    specs = {"up": P(AXIS), "up_bias": P(AXIS), "down": P(AXIS)}
    return jax.shard_map(shard_fn, mesh=mesh, in_specs=(specs, P(AXIS)), out_specs=P(AXIS))(params, x)
