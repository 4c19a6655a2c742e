# Residual MLP, weights stored column-sharded (FSDP over the output dimension), 2-D mesh.
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

D, F, B = 8, 16, 4


class MLPWeights(NamedTuple):
    up: jax.Array    # [D, F]
    down: jax.Array  # [F, D]


def example_inputs():
    w = MLPWeights(jax.ShapeDtypeStruct((D, F), jnp.float32),
                   jax.ShapeDtypeStruct((F, D), jnp.float32))
    return w, jax.ShapeDtypeStruct((B, D), jnp.float32)


def residual_mlp(w: MLPWeights, x):
    return x + jnp.maximum(x @ w.up, 0.0) @ w.down


def residual_mlp_fsdp(w: MLPWeights, x, mesh):
    def local(w_shard: MLPWeights, xs):
        up = jax.lax.all_gather(w_shard.up, "fsdp", axis=1, tiled=True)
        down = jax.lax.all_gather(w_shard.down, "fsdp", axis=1, tiled=True)
        return residual_mlp(MLPWeights(up, down), xs)

    col = P(None, "fsdp")
    return jax.shard_map(local, mesh=mesh, in_specs=(MLPWeights(col, col), P("data")),
                         out_specs=P("data"), check_vma=False)(w, x)


def residual_mlp_fsdp_gathered(w: MLPWeights, x, mesh):
    def local(w_shard: MLPWeights, xs):
        up = jax.lax.all_gather(w_shard.up, "fsdp", axis=1, tiled=True)
        down = jax.lax.all_gather(w_shard.down, "fsdp", tiled=True).reshape(F, D)
        return residual_mlp(MLPWeights(up, down), xs)

    col = P(None, "fsdp")
    return jax.shard_map(local, mesh=mesh, in_specs=(MLPWeights(col, col), P("data")),
                         out_specs=P("data"), check_vma=False)(w, x)
