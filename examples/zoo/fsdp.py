"""Fully-sharded data parallelism (ZeRO-3 style): weights are stored sharded and all-gathered
just before use; the batch is split along the same axis. The 2-D variant combines FSDP with
tensor parallelism on a (fsdp, tp) mesh.
"""

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from common import spec

B, D, F = 8, 16, 32
FSDP, TP = "fsdp", "tp"


def mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


def inputs():
    return (spec(B, D), spec(D, F), spec(F, D))


def mlp_fsdp(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        w1 = lax.all_gather(w1, FSDP, axis=0, tiled=True)  # (D, F)
        w2 = lax.all_gather(w2, FSDP, axis=0, tiled=True)  # (F, D)
        return jax.nn.gelu(x @ w1) @ w2

    return jax.shard_map(
        body, mesh=mesh, in_specs=(P(FSDP), P(FSDP, None), P(FSDP, None)), out_specs=P(FSDP),
    )(x, w1, w2)


def mlp_fsdp_tp(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        w1 = lax.all_gather(w1, FSDP, axis=0, tiled=True)  # (D, F / tp): column-parallel
        w2 = lax.all_gather(w2, FSDP, axis=1, tiled=True)  # (F / tp, D): row-parallel
        return lax.psum(jax.nn.gelu(x @ w1) @ w2, TP)

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(FSDP), P(FSDP, TP), P(TP, FSDP)),
        out_specs=P(FSDP),
    )(x, w1, w2)


def mlp_fsdp_tp_gather_over_tp(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        w1 = lax.all_gather(w1, TP, axis=0, tiled=True)  # BUG: gathers the row shards over the tp axis instead of fsdp
        w2 = lax.all_gather(w2, FSDP, axis=1, tiled=True)
        return lax.psum(jax.nn.gelu(x @ w1) @ w2, TP)

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(FSDP), P(FSDP, TP), P(TP, FSDP)),
        out_specs=P(FSDP),
    )(x, w1, w2)
