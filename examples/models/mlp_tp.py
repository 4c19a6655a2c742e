"""Megatron-style tensor-parallel versions of the blocks in mlp.py.

Column-parallel first matmul (weights split on their output columns), element-wise
activation on the local slice, row-parallel second matmul (weights split on their input
rows) whose partial sums are added with one psum.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TP = "tp"


def mlp(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        h = jnp.tanh(x @ w1)  # (tokens, d_ff / tp)
        return lax.psum(h @ w2, TP)

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(), P(None, TP), P(TP, None)),
        out_specs=P(),
    )(x, w1, w2)


def mlp_bias(x, w1, b1, w2, b2, *, mesh):
    def body(x, w1, b1, w2, b2):
        h = jax.nn.gelu(x @ w1 + b1)  # b1 is split like w1's columns
        out = lax.psum(h @ w2, TP)
        return out + b2  # the output bias is added once, after the reduction

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(), P(None, TP), P(TP), P(TP, None), P()),
        out_specs=P(),
    )(x, w1, b1, w2, b2)


def swiglu(x, w_gate, w_up, w_down, *, mesh):
    def body(x, w_gate, w_up, w_down):
        h = jax.nn.silu(x @ w_gate) * (x @ w_up)
        return lax.psum(h @ w_down, TP)

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(), P(None, TP), P(None, TP), P(TP, None)),
        out_specs=P(),
    )(x, w_gate, w_up, w_down)


def projection(x, w, *, mesh):
    """Column-parallel projection whose output is re-assembled on every device."""

    def body(x, w):
        y = jax.nn.gelu(x @ w)  # (batch, seq, d_ff / tp)
        return lax.all_gather(y, TP, axis=2, tiled=True)  # (batch, seq, d_ff)

    # all_gather makes the value replicated, which shard_map's static check cannot see.
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, TP)), out_specs=P(), check_vma=False)(x, w)


def mlp_sliced(x, w1, w2, *, mesh):
    """Weights arrive replicated (e.g. straight from a checkpoint); each shard cuts its block."""
    n = mesh.shape[TP]

    def body(x, w1, w2):
        i = lax.axis_index(TP)
        block = w1.shape[1] // n
        w1_local = lax.dynamic_slice_in_dim(w1, i * block, block, axis=1)
        w2_local = lax.dynamic_slice_in_dim(w2, i * block, block, axis=0)
        h = jnp.tanh(x @ w1_local)
        return lax.psum(h @ w2_local, TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P())(x, w1, w2)
