"""Attention with a fused QKV projection, w_qkv = [wq | wk | wv] (D, 3 * H * Dh).

The checkpoint keeps the fused weight replicated; every tensor-parallel shard slices its
own heads out of each of the three blocks.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import causal_attention, spec

B, S, D = 2, 8, 32
N_HEADS, HEAD_DIM = 4, 8
HD = N_HEADS * HEAD_DIM
TP = "tp"


def attention(x, w_qkv, wo):
    b, s, _ = x.shape
    q, k, v = jnp.split(x @ w_qkv, 3, axis=-1)
    heads = lambda t: t.reshape(b, s, N_HEADS, HEAD_DIM)
    o = causal_attention(heads(q), heads(k), heads(v))
    return o.reshape(b, s, HD) @ wo


def inputs():
    return (spec(B, S, D), spec(D, 3 * HD), spec(HD, D))


def attention_tp(x, w_qkv, wo, *, mesh):
    cols = HD // mesh.shape[TP]  # columns of each of q, k, v per shard

    def body(x, w_qkv, wo):
        b, s, _ = x.shape
        i = lax.axis_index(TP)
        w_q = lax.dynamic_slice_in_dim(w_qkv, i * cols, cols, axis=1)
        w_k = lax.dynamic_slice_in_dim(w_qkv, HD + i * cols, cols, axis=1)
        w_v = lax.dynamic_slice_in_dim(w_qkv, 2 * HD + i * cols, cols, axis=1)
        heads = lambda t: t.reshape(b, s, -1, HEAD_DIM)
        o = causal_attention(heads(x @ w_q), heads(x @ w_k), heads(x @ w_v))
        return lax.psum(o.reshape(b, s, -1) @ wo, TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(TP, None)), out_specs=P())(x, w_qkv, wo)


def attention_tp_wrong_k_offset(x, w_qkv, wo, *, mesh):
    cols = HD // mesh.shape[TP]

    def body(x, w_qkv, wo):
        b, s, _ = x.shape
        i = lax.axis_index(TP)
        w_q = lax.dynamic_slice_in_dim(w_qkv, i * cols, cols, axis=1)
        w_k = lax.dynamic_slice_in_dim(w_qkv, cols + i * cols, cols, axis=1)  # BUG: K block starts at HD, not at cols (takes the next shard's Q)
        w_v = lax.dynamic_slice_in_dim(w_qkv, 2 * HD + i * cols, cols, axis=1)
        heads = lambda t: t.reshape(b, s, -1, HEAD_DIM)
        o = causal_attention(heads(x @ w_q), heads(x @ w_k), heads(x @ w_v))
        return lax.psum(o.reshape(b, s, -1) @ wo, TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(TP, None)), out_specs=P())(x, w_qkv, wo)
