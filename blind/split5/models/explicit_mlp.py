"""Residual GeLU MLP written against explicit mesh axes (explicit_axes + reshard + out_sharding).

The entrypoint receives the Auto-typed mesh; the model code switches its axes to Explicit and
states every layout: batch over 'data', the hidden dimension over 'model'.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

BATCH, D_MODEL, D_FF = 8, 16, 32


def mlp_inputs():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, D_MODEL), f32),
            {"up": jax.ShapeDtypeStruct((D_MODEL, D_FF), f32),
             "up_bias": jax.ShapeDtypeStruct((D_FF,), f32),
             "down": jax.ShapeDtypeStruct((D_FF, D_MODEL), f32)})


def residual_mlp(x, params):
    h = jax.nn.gelu(x @ params["up"] + params["up_bias"], approximate=False)
    return x + h @ params["down"]


def _explicit_body(x, params):
    x = jax.sharding.reshard(x, P("data", None))
    up = jax.sharding.reshard(params["up"], P(None, "model"))
    bias = jax.sharding.reshard(params["up_bias"], P("model"))
    down = jax.sharding.reshard(params["down"], P("model", None))
    h = jax.nn.gelu(jnp.matmul(x, up) + bias, approximate=False)
    y = jnp.matmul(h, down, out_sharding=P("data", None))
    return jax.sharding.reshard(x + y, P())


def residual_mlp_explicit(x, params):
    body = jax.sharding.explicit_axes(_explicit_body, axes=("data", "model"),
                                      in_sharding=(P(), {"up": P(), "up_bias": P(), "down": P()}))
    return body(x, params)
