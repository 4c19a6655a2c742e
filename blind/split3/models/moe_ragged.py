"""Dropless top-1 MoE in the megablox style: tokens are sorted by expert, every expert's rows form
one ragged group of a grouped matmul, and the result is un-sorted. The sharded version splits the
tokens across devices and all-gathers the expert weights (stored sharded by expert)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_TOK, D_IN, D_HID, N_EXP = 32, 8, 16, 4


def grouped_ffn(tokens, w_router, w_up, w_down):
    scores = tokens @ w_router
    expert_id = jnp.argmax(scores, axis=-1)
    weight = jax.nn.sigmoid(jnp.max(scores, axis=-1))
    order = jnp.argsort(expert_id, stable=True)
    sorted_tokens = tokens[order]
    sizes = jnp.bincount(expert_id, length=N_EXP).astype(jnp.int32)
    h = jax.nn.relu(lax.ragged_dot(sorted_tokens, w_up, sizes))
    y_sorted = lax.ragged_dot(h, w_down, sizes)
    y = jnp.zeros_like(y_sorted).at[order].set(y_sorted)
    return y * weight[:, None]


def grouped_ffn_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((N_TOK, D_IN), f32),
        jax.ShapeDtypeStruct((D_IN, N_EXP), f32),
        jax.ShapeDtypeStruct((N_EXP, D_IN, D_HID), f32),
        jax.ShapeDtypeStruct((N_EXP, D_HID, D_IN), f32),
    )


def grouped_ffn_sharded(tokens, w_router, w_up, w_down, mesh):
    def local(tok, router, up_shard, down_shard):
        up = lax.all_gather(up_shard, "data", tiled=True)
        down = lax.all_gather(down_shard, "data", tiled=True)
        return grouped_ffn(tok, router, up, down)

    return jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P(), P("data"), P("data")), out_specs=P("data"))(
        tokens, w_router, w_up, w_down
    )
