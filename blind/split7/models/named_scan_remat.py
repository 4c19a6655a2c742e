# Stack of pre-norm residual MLP layers: scan over stacked parameters, each layer wrapped in
# jax.checkpoint and jax.named_call; the sharded version only adds sharding constraints.
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_LAYERS, TOKENS, WIDTH, INNER = 3, 8, 8, 16


def inputs():
    f = jnp.float32
    params = {"norm": jax.ShapeDtypeStruct((N_LAYERS, WIDTH), f),
              "fc1": jax.ShapeDtypeStruct((N_LAYERS, WIDTH, INNER), f),
              "fc2": jax.ShapeDtypeStruct((N_LAYERS, INNER, WIDTH), f)}
    return params, jax.ShapeDtypeStruct((TOKENS, WIDTH), f)


def _norm(x, g):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


@functools.partial(jax.named_call, name="mlp_layer")
def _layer(x, p):
    return x + jax.nn.gelu(_norm(x, p["norm"]) @ p["fc1"]) @ p["fc2"]


def stack(params, x):
    def body(h, p):
        return jax.checkpoint(_layer)(h, p), None

    return jax.lax.scan(body, x, params)[0]


def stack_sharded(params, x, mesh):
    def shard(t, *spec):
        return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P(*spec)))

    @functools.partial(jax.named_call, name="mlp_layer_tp")
    def layer(h, p):
        u = shard(_norm(h, p["norm"]) @ shard(p["fc1"], None, "model"), "batch", "model")
        return shard(h + jax.nn.gelu(u) @ shard(p["fc2"], "model", None), "batch", None)

    def body(h, p):
        return jax.checkpoint(layer)(h, p), None

    return jax.lax.scan(body, shard(x, "batch", None), params)[0]


def stack_sharded_v2(params, x, mesh):
    def shard(t, *spec):
        return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P(*spec)))

    @functools.partial(jax.named_call, name="mlp_layer_tp")
    def layer(h, p):
        u = shard(_norm(h, p["norm"]) @ shard(p["fc1"], None, "model"), "batch", "model")
        return shard(jax.nn.gelu(u) @ shard(p["fc2"], "model", None), "batch", None)

    def body(h, p):
        return jax.checkpoint(layer)(h, p), None

    return jax.lax.scan(body, shard(x, "batch", None), params)[0]
