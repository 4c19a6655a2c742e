"""Mixed precision in a tensor-parallel MLP.

The reference runs the matmuls on bf16 inputs with f32 accumulation and keeps f32 outputs.
The correct sharded version does the same per shard and all-reduces in f32 (re-association
of f32 sums only). The "fast" version all-reduces in bf16 to halve the traffic: a different
function (every partial sum is rounded to bf16), not a re-association.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import spec

T, D, F = 8, 32, 64
TP = "tp"
BF16 = jnp.bfloat16


def _mm(a, b):
    return jnp.dot(a.astype(BF16), b.astype(BF16), preferred_element_type=jnp.float32)


def mlp(x, w1, w2):
    return _mm(jnp.tanh(_mm(x, w1)), w2)


def inputs():
    return (spec(T, D), spec(D, F), spec(F, D))


def mlp_tp(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        return lax.psum(_mm(jnp.tanh(_mm(x, w1)), w2), TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, TP), P(TP, None)), out_specs=P())(x, w1, w2)


def mlp_tp_bf16_allreduce(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        partial = _mm(jnp.tanh(_mm(x, w1)), w2)
        return lax.psum(partial.astype(BF16), TP).astype(jnp.float32)  # BUG: all-reduce in bf16; the reference sums in f32

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, TP), P(TP, None)), out_specs=P())(x, w1, w2)
