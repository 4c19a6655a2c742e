"""Ring exchange with ppermute: an all-gather matmul overlapped with communication.

x is split by rows (tokens) and w by columns. Instead of all-gathering x, each device
multiplies the block it holds, passes it to its ring neighbour and repeats, filling the rows
of its output column block as the blocks go by.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import spec

T, D, F = 16, 16, 32
TP = "tp"


def matmul(x, w):
    return x @ w


def inputs():
    return (spec(T, D), spec(D, F))


def _ring_matmul(x, w, mesh, perm_of):
    n = mesh.shape[TP]

    def body(x_blk, w):  # x_blk: (T / n, D) rows; w: (D, F / n) columns
        i = lax.axis_index(TP)
        rows = x_blk.shape[0]
        out = jnp.zeros((rows * n, w.shape[1]), x_blk.dtype)
        for step in range(n):
            src = (i - step) % n  # whose rows we hold at this step
            out = lax.dynamic_update_slice_in_dim(out, x_blk @ w, src * rows, axis=0)
            if step < n - 1:
                x_blk = lax.ppermute(x_blk, TP, perm=perm_of(n))
        return out

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P(None, TP)), out_specs=P(None, TP))(x, w)


def ring_matmul(x, w, *, mesh):
    return _ring_matmul(x, w, mesh, lambda n: [(j, (j + 1) % n) for j in range(n)])


def ring_matmul_wrong_direction(x, w, *, mesh):
    return _ring_matmul(x, w, mesh, lambda n: [(j, (j - 1) % n) for j in range(n)])  # BUG: sends to the left neighbour; src = i - step assumes blocks come from the left
