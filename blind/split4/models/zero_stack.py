"""Scan over a stack of residual layers; weights sharded ZeRO-style by sharding constraints only."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_LAYERS, WIDTH, BATCH = 3, 16, 8


def example_args():
    stack = jax.ShapeDtypeStruct((N_LAYERS, WIDTH, WIDTH), jnp.float32)
    bias = jax.ShapeDtypeStruct((N_LAYERS, WIDTH), jnp.float32)
    return stack, bias, jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32)


def layer(h, wb):
    w, b = wb
    return h + jnp.tanh(jnp.dot(h, w) + b), None


def net(stack, bias, x):
    out, _ = jax.lax.scan(layer, x, (stack, bias))
    return out


def net_sharded(stack, bias, x, mesh):
    stack = jax.lax.with_sharding_constraint(stack, NamedSharding(mesh, P(None, "fsdp", None)))
    bias = jax.lax.with_sharding_constraint(bias, NamedSharding(mesh, P(None, "fsdp")))
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("fsdp", None)))

    def gathered_layer(h, wb):
        w, b = wb
        w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P()))
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("fsdp", None)))
        return layer(h, (w, b))

    out, _ = jax.lax.scan(gathered_layer, x, (stack, bias))
    return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, P("fsdp", None)))
