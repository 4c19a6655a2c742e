"""Grouped (block-diagonal) projection written with explicit lax.dot_general batch dimensions,
with FSDP-sharded weights gathered without tiling."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

G, T, D, F = 2, 8, 8, 12
N_SHARDS = 4

# batch over the group axis, contract the feature axis
_DN = (((2,), (1,)), ((0,), (0,)))


def grouped_proj(x, w, bias):
    """x [G, T, D], w [G, D, F], bias [G, F] -> [G, T, F]."""
    y = lax.dot_general(x, w, _DN)
    return jnp.tanh(y + bias[:, None, :])


def _gather_features(w_shard, axis_name):
    # w_shard [G, D, F/n]; all_gather without tiling stacks the shards in a new leading axis
    stacked = lax.all_gather(w_shard, axis_name)            # [n, G, D, F/n]
    return jnp.moveaxis(stacked, 0, 2).reshape(G, D, F)     # [G, D, n, F/n] -> [G, D, F]


def grouped_proj_fsdp(x, w, bias, mesh):
    def body(x_l, w_l, b_l):
        w_full = _gather_features(w_l, "data")
        b_full = lax.all_gather(b_l, "data", axis=1, tiled=True)
        return grouped_proj(x_l, w_full, b_full)

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(None, "data"), P(None, None, "data"), P(None, "data")),
        out_specs=P(None, "data"),
    )(x, w, bias)


def grouped_proj_fsdp_stack_axis(x, w, bias, mesh):
    def body(x_l, w_l, b_l):
        stacked = lax.all_gather(w_l, "data")               # [n, G, D, F/n]
        w_full = stacked.reshape(G, D, F)
        b_full = lax.all_gather(b_l, "data", axis=1, tiled=True)
        return grouped_proj(x_l, w_full, b_full)

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(None, "data"), P(None, None, "data"), P(None, "data")),
        out_specs=P(None, "data"),
    )(x, w, bias)


def shapes():
    s = jax.ShapeDtypeStruct
    return (s((G, T, D), jnp.float32), s((G, D, F), jnp.float32), s((G, F), jnp.float32))
