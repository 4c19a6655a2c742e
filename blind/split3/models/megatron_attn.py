"""Megatron-style self-attention: the fused QKV projection stores q, k and v of a head next to
each other ([d_model, heads, 3 * head_dim]); heads are split across tensor-parallel ranks."""

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, HEADS, HD = 2, 8, 32, 4, 8


def _heads_attention(t, w_dense):
    q, k, v = t[..., :HD], t[..., HD : 2 * HD], t[..., 2 * HD :]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HD)
    probs = jax.nn.softmax(scores, axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    return jnp.einsum("bqhd,hde->bqe", ctx, w_dense)


def self_attention(hidden, w_qkv, w_dense):
    t = jnp.einsum("bsd,dhe->bshe", hidden, w_qkv)
    return _heads_attention(t, w_dense)


def self_attention_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((B, S, D), f32),
        jax.ShapeDtypeStruct((D, HEADS, 3 * HD), f32),
        jax.ShapeDtypeStruct((HEADS, HD, D), f32),
    )


def self_attention_tp(hidden, w_qkv, w_dense, mesh):
    def rank_fn(x, wqkv, wd):
        t = jnp.einsum("bsd,dhe->bshe", x, wqkv)
        return lax.psum(_heads_attention(t, wd), "model")

    return jax.shard_map(
        rank_fn,
        mesh=mesh,
        in_specs=(P(), P(None, "model", None), P("model", None, None)),
        out_specs=P(),
    )(hidden, w_qkv, w_dense)


def self_attention_tp_kv_swapped(hidden, w_qkv, w_dense, mesh):
    def rank_fn(x, wqkv, wd):
        t = jnp.einsum("bsd,dhe->bshe", x, wqkv)
        q = t[..., :HD]
        v, k = t[..., HD : 2 * HD], t[..., 2 * HD :]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HD)
        probs = jax.nn.softmax(scores, axis=-1)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        return lax.psum(jnp.einsum("bqhd,hde->bqe", ctx, wd), "model")

    return jax.shard_map(
        rank_fn,
        mesh=mesh,
        in_specs=(P(), P(None, "model", None), P("model", None, None)),
        out_specs=P(),
    )(hidden, w_qkv, w_dense)
