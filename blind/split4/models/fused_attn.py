"""Multi-head self-attention with one fused QKV projection, tensor-parallel over heads."""

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

BATCH, SEQ, EMBED, HEADS, HEAD_DIM = 2, 8, 16, 4, 4


def arg_specs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, EMBED), f),
            jax.ShapeDtypeStruct((EMBED, 3 * HEADS * HEAD_DIM), f),
            jax.ShapeDtypeStruct((HEADS * HEAD_DIM, EMBED), f))


def _attend(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def self_attention(x, w_qkv, w_o):
    # columns of w_qkv: [all q heads | all k heads | all v heads]
    qkv = x @ w_qkv
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q, k, v = (t.reshape(BATCH, SEQ, HEADS, HEAD_DIM) for t in (q, k, v))
    o = _attend(q, k, v).reshape(BATCH, SEQ, HEADS * HEAD_DIM)
    return o @ w_o


def self_attention_tp(x, w_qkv, w_o, mesh):
    w4 = w_qkv.reshape(EMBED, 3, HEADS, HEAD_DIM)
    w_o3 = w_o.reshape(HEADS, HEAD_DIM, EMBED)

    def per_device(x, w4, w_o3):
        q = jnp.einsum("bsd,dhk->bshk", x, w4[:, 0])
        k = jnp.einsum("bsd,dhk->bshk", x, w4[:, 1])
        v = jnp.einsum("bsd,dhk->bshk", x, w4[:, 2])
        o = _attend(q, k, v)
        return jax.lax.psum(jnp.einsum("bshk,hkd->bsd", o, w_o3), "tp")

    return jax.shard_map(per_device, mesh=mesh,
                         in_specs=(P(), P(None, None, "tp", None), P("tp", None, None)),
                         out_specs=P())(x, w4, w_o3)


def self_attention_tp_k_slip(x, w_qkv, w_o, mesh):
    w4 = w_qkv.reshape(EMBED, 3, HEADS, HEAD_DIM)
    w_o3 = w_o.reshape(HEADS, HEAD_DIM, EMBED)

    def per_device(x, w4, w_o3):
        q = jnp.einsum("bsd,dhk->bshk", x, w4[:, 0])
        k = jnp.einsum("bsd,dhk->bshk", x, w4[:, 0])
        v = jnp.einsum("bsd,dhk->bshk", x, w4[:, 2])
        o = _attend(q, k, v)
        return jax.lax.psum(jnp.einsum("bshk,hkd->bsd", o, w_o3), "tp")

    return jax.shard_map(per_device, mesh=mesh,
                         in_specs=(P(), P(None, None, "tp", None), P("tp", None, None)),
                         out_specs=P())(x, w4, w_o3)
