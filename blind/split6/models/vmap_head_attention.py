"""Causal self-attention written per head and vmapped over batch and heads; fused [q|k|v] weight.

The tensor-parallel version keeps the fused weight replicated and cuts its own q, k and v column
blocks out of it with offsets computed from the device index.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D_MODEL, N_HEADS, HEAD_DIM, SEQ, BATCH = 16, 4, 4, 6, 2
TP = 2


def one_head(q, k, v):
    """q, k, v: [SEQ, HEAD_DIM] for a single head."""
    scores = q @ k.T / math.sqrt(HEAD_DIM)
    causal = jnp.tril(jnp.ones((q.shape[0], k.shape[0]), dtype=bool))
    scores = jnp.where(causal, scores, -1e9)
    return jax.nn.softmax(scores, axis=-1) @ v


# [B, S, H, hd] x3 -> [B, S, H, hd]: vmap over batch (axis 0), then heads (axis 1 of [S, H, hd])
all_heads = jax.vmap(jax.vmap(one_head, in_axes=1, out_axes=1))


def attention(x, w_qkv, w_o):
    qkv = x @ w_qkv
    q, k, v = jnp.split(qkv, 3, axis=-1)
    split = lambda t: t.reshape(BATCH, SEQ, N_HEADS, HEAD_DIM)
    o = all_heads(split(q), split(k), split(v))
    return o.reshape(BATCH, SEQ, N_HEADS * HEAD_DIM) @ w_o


def _tp_attention(v_start_of):
    heads = N_HEADS // TP
    width = heads * HEAD_DIM

    def local(x, w_qkv, w_o_rows):
        dev = lax.axis_index("tp")
        q_w = lax.dynamic_slice_in_dim(w_qkv, dev * width, width, axis=1)
        k_w = lax.dynamic_slice_in_dim(w_qkv, N_HEADS * HEAD_DIM + dev * width, width, axis=1)
        v_w = lax.dynamic_slice_in_dim(w_qkv, v_start_of(dev), width, axis=1)
        split = lambda t: t.reshape(BATCH, SEQ, heads, HEAD_DIM)
        o = all_heads(split(x @ q_w), split(x @ k_w), split(x @ v_w))
        partial_out = o.reshape(BATCH, SEQ, width) @ w_o_rows
        return lax.psum(partial_out, "tp")

    return jax.shard_map(local, in_specs=(P(), P(), P("tp", None)), out_specs=P())


def attention_tp(x, w_qkv, w_o):
    width = (N_HEADS // TP) * HEAD_DIM
    return _tp_attention(lambda dev: 2 * N_HEADS * HEAD_DIM + dev * width)(x, w_qkv, w_o)


def attention_tp_v_offset(x, w_qkv, w_o):
    heads = N_HEADS // TP
    return _tp_attention(lambda dev: 2 * N_HEADS * HEAD_DIM + dev * heads)(x, w_qkv, w_o)


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), f),
            jax.ShapeDtypeStruct((D_MODEL, 3 * N_HEADS * HEAD_DIM), f),
            jax.ShapeDtypeStruct((N_HEADS * HEAD_DIM, D_MODEL), f))
