"""Data x tensor parallelism on a 2-D (dp, tp) mesh: the batch is split over dp, the MLP
weights over tp; the row-parallel partial sums are reduced over tp only.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import spec

B, D, F = 8, 16, 32
DP, TP = "dp", "tp"


def mlp(x, w1, b1, w2):
    return jnp.tanh(x @ w1 + b1) @ w2


def inputs():
    return (spec(B, D), spec(D, F), spec(F), spec(F, D))


def mlp_dp_tp(x, w1, b1, w2, *, mesh):
    def body(x, w1, b1, w2):  # x: (B / dp, D)
        return lax.psum(jnp.tanh(x @ w1 + b1) @ w2, TP)

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(DP, None), P(None, TP), P(TP), P(TP, None)),
        out_specs=P(DP, None),
    )(x, w1, b1, w2)


def mlp_dp_tp_reduce_all_axes(x, w1, b1, w2, *, mesh):
    def body(x, w1, b1, w2):
        return lax.psum(jnp.tanh(x @ w1 + b1) @ w2, mesh.axis_names)  # BUG: reduces over dp as well, adding up different examples of the batch

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(DP, None), P(None, TP), P(TP), P(TP, None)),
        out_specs=P(DP, None),
    )(x, w1, b1, w2)


def mlp_dp_tp_reduce_dp(x, w1, b1, w2, *, mesh):
    def body(x, w1, b1, w2):
        return lax.psum(jnp.tanh(x @ w1 + b1) @ w2, DP)  # BUG: psum over dp instead of tp

    # check_vma=False: the replication check would reject this (and was turned off to "fix" it).
    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(DP, None), P(None, TP), P(TP), P(TP, None)),
        out_specs=P(DP, None), check_vma=False,
    )(x, w1, b1, w2)
