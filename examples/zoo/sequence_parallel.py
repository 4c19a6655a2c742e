"""Megatron sequence parallelism around a tensor-parallel MLP block.

Between blocks the activations are split along the sequence. The block all-gathers the
sequence before the column-parallel matmul and reduce-scatters (psum_scatter) the row-parallel
partial sums back to sequence shards, instead of one psum.
"""

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from common import rms_norm, spec

B, S, D, F = 2, 16, 16, 32
TP = "tp"


def block(x, gamma, w1, w2):
    h = rms_norm(x, gamma)
    return x + jax.nn.gelu(h @ w1) @ w2


def inputs():
    return (spec(B, S, D), spec(D), spec(D, F), spec(F, D))


def block_sp(x, gamma, w1, w2, *, mesh):
    def body(x, gamma, w1, w2):  # x: (B, S / tp, D)
        h = rms_norm(x, gamma)  # the norm is per token: no communication
        h = lax.all_gather(h, TP, axis=1, tiled=True)  # (B, S, D)
        partial = jax.nn.gelu(h @ w1) @ w2
        out = lax.psum_scatter(partial, TP, scatter_dimension=1, tiled=True)  # (B, S / tp, D)
        return x + out

    seq = P(None, TP, None)
    return jax.shard_map(
        body, mesh=mesh, in_specs=(seq, P(), P(None, TP), P(TP, None)), out_specs=seq,
    )(x, gamma, w1, w2)


def block_sp_residual_before_scatter(x, gamma, w1, w2, *, mesh):
    def body(x, gamma, w1, w2):
        h = rms_norm(x, gamma)
        h = lax.all_gather(h, TP, axis=1, tiled=True)
        x_full = lax.all_gather(x, TP, axis=1, tiled=True)
        partial = jax.nn.gelu(h @ w1) @ w2
        return lax.psum_scatter(x_full + partial, TP, scatter_dimension=1, tiled=True)  # BUG: residual added to every shard's partial sum, so it is counted tp times

    seq = P(None, TP, None)
    return jax.shard_map(
        body, mesh=mesh, in_specs=(seq, P(), P(None, TP), P(TP, None)), out_specs=seq,
    )(x, gamma, w1, w2)
