"""Rotary position embeddings on sequence-sharded activations (context parallelism).

Each shard holds a contiguous block of the sequence, so its positions start at
axis_index * block, not at 0.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import rope, spec

B, S, H, DH = 2, 16, 2, 8
SP = "sp"
SEQ = P(None, SP, None, None)


def apply_rope(q, k):
    pos = jnp.arange(q.shape[1])
    return rope(q, pos), rope(k, pos)


def inputs():
    return (spec(B, S, H, DH), spec(B, S, H, DH))


def apply_rope_sp(q, k, *, mesh):
    def body(q, k):
        block = q.shape[1]
        pos = lax.axis_index(SP) * block + jnp.arange(block)
        return rope(q, pos), rope(k, pos)

    return jax.shard_map(body, mesh=mesh, in_specs=(SEQ, SEQ), out_specs=(SEQ, SEQ))(q, k)


def apply_rope_sp_no_offset(q, k, *, mesh):
    def body(q, k):
        pos = jnp.arange(q.shape[1])  # BUG: local positions; every shard restarts at 0 instead of axis_index * block
        return rope(q, pos), rope(k, pos)

    return jax.shard_map(body, mesh=mesh, in_specs=(SEQ, SEQ), out_specs=(SEQ, SEQ))(q, k)
