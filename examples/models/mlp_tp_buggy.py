"""Tensor-parallel MLP blocks with one realistic bug each (see configs/buggy.yaml)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TP = "tp"


def mlp_sliced_wrong_offset(x, w1, w2, *, mesh):
    n = mesh.shape[TP]

    def body(x, w1, w2):
        i = lax.axis_index(TP)
        block = w1.shape[1] // n
        w1_local = lax.dynamic_slice_in_dim(w1, i * block, block, axis=1)
        w2_local = lax.dynamic_slice_in_dim(w2, i * (w2.shape[1] // n), block, axis=0)  # BUG: offset uses w2's output dim, not the d_ff block
        h = jnp.tanh(x @ w1_local)
        return lax.psum(h @ w2_local, TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P())(x, w1, w2)


def mlp_missing_psum(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        h = jnp.tanh(x @ w1)
        return h @ w2  # BUG: row-parallel partial sums are never reduced (missing psum)

    # check_vma=False silences the replication check that would have caught it.
    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(), P(None, TP), P(TP, None)),
        out_specs=P(), check_vma=False,
    )(x, w1, w2)


def _row_parallel(h, w):
    """Row-parallel linear: local matmul, then all-reduce of the partial sums."""
    return lax.psum(h @ w, TP)


def swiglu_double_psum(x, w_gate, w_up, w_down, *, mesh):
    def body(x, w_gate, w_up, w_down):
        h = jax.nn.silu(x @ w_gate) * (x @ w_up)
        out = _row_parallel(h, w_down)
        return lax.psum(out, TP)  # BUG: psum of a value _row_parallel already reduced

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(), P(None, TP), P(None, TP), P(TP, None)),
        out_specs=P(),
    )(x, w_gate, w_up, w_down)


def projection_gather_wrong_axis(x, w, *, mesh):
    def body(x, w):
        batch, seq, _ = x.shape
        y = jax.nn.gelu(x @ w)  # (batch, seq, d_ff / tp)
        y = lax.all_gather(y, TP, axis=1, tiled=True)  # BUG: gathers along tokens instead of features
        return y.reshape(batch, seq, -1)

    # all_gather's result is the same on every shard, but the replication checker cannot
    # prove it, hence check_vma=False.
    return jax.shard_map(
        body, mesh=mesh, in_specs=(P(), P(None, TP)), out_specs=P(), check_vma=False,
    )(x, w)


def mlp_bias_added_per_shard(x, w1, b1, w2, b2, *, mesh):
    def body(x, w1, b1, w2, b2):
        h = jax.nn.gelu(x @ w1 + b1)
        return lax.psum(h @ w2 + b2, TP)  # BUG: b2 added before the psum, so it is counted tp times

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(), P(None, TP), P(TP), P(TP, None), P()),
        out_specs=P(),
    )(x, w1, b1, w2, b2)
