"""Causal self-attention with a fused QKV projection, tensor-parallel over heads."""

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D = 2, 8, 32
HEADS, HEAD_DIM = 8, 8
Q_HEADS, KV_HEADS = 4, 2


def _causal_attention(q, k, v):
    """q: [b, s, hq, hd]; k, v: [b, s, hkv, hd] with hq a multiple of hkv."""
    group = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, group, axis=2)
    v = jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = q.shape[1]
    causal = jnp.tril(jnp.ones((s, s), bool))
    scores = jnp.where(causal, scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def attention(params, x):
    b, s, _ = x.shape
    qkv = (x @ params["wqkv"]).reshape(b, s, 3, HEADS, HEAD_DIM)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = _causal_attention(q, k, v)
    return out.reshape(b, s, HEADS * HEAD_DIM) @ params["wo"]


def attention_inputs():
    f32 = jnp.float32
    return ({"wqkv": jax.ShapeDtypeStruct((D, 3 * HEADS * HEAD_DIM), f32),
             "wo": jax.ShapeDtypeStruct((HEADS * HEAD_DIM, D), f32)},
            jax.ShapeDtypeStruct((B, S, D), f32))


def attention_tp(params, x, mesh):
    tp = mesh.shape["tp"]
    wqkv = params["wqkv"].reshape(D, 3, HEADS, HEAD_DIM)
    wo = params["wo"].reshape(HEADS, HEAD_DIM, D)

    def local(wqkv, wo, x):
        heads = wqkv.shape[2]
        fused = x @ wqkv.reshape(D, 3 * heads * HEAD_DIM)
        width = heads * HEAD_DIM
        q = fused[..., :width].reshape(B, S, heads, HEAD_DIM)
        k = fused[..., width:2 * width].reshape(B, S, heads, HEAD_DIM)
        v = fused[..., 2 * width:].reshape(B, S, heads, HEAD_DIM)
        out = _causal_attention(q, k, v)
        return lax.psum(jnp.einsum("bshd,hdm->bsm", out, wo), "tp")

    assert HEADS % tp == 0
    return jax.shard_map(local, mesh=mesh,
                         in_specs=(P(None, None, "tp", None), P("tp", None, None), P()),
                         out_specs=P())(wqkv, wo, x)


# Grouped-query attention: the checkpoint stores [q heads | k heads | v heads] along columns.
def gqa(params, x):
    y = x @ params["wqkv"]
    nq, nk = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    q = y[..., :nq].reshape(B, S, Q_HEADS, HEAD_DIM)
    k = y[..., nq:nq + nk].reshape(B, S, KV_HEADS, HEAD_DIM)
    v = y[..., nq + nk:].reshape(B, S, KV_HEADS, HEAD_DIM)
    out = _causal_attention(q, k, v).reshape(B, S, nq)
    return out @ params["wo"]


def gqa_inputs():
    f32 = jnp.float32
    cols = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    return ({"wqkv": jax.ShapeDtypeStruct((D, cols), f32),
             "wo": jax.ShapeDtypeStruct((Q_HEADS * HEAD_DIM, D), f32)},
            jax.ShapeDtypeStruct((B, S, D), f32))


def _interleave_for_tp(wqkv, tp):
    """[d, q|k|v] -> [d, tp, q_shard|k_shard|v_shard] so each TP rank gets one contiguous block."""
    nq, nk = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    q = wqkv[:, :nq].reshape(D, tp, nq // tp)
    k = wqkv[:, nq:nq + nk].reshape(D, tp, nk // tp)
    v = wqkv[:, nq + nk:].reshape(D, tp, nk // tp)
    return jnp.concatenate([q, k, v], axis=-1)


def gqa_tp(params, x, mesh):
    tp = mesh.shape["tp"]
    hq, hkv = Q_HEADS // tp, KV_HEADS // tp

    def shard_fn(w, wo, x):
        y = x @ w.reshape(D, -1)
        q = y[..., :hq * HEAD_DIM]
        k = y[..., hq * HEAD_DIM:(hq + hkv) * HEAD_DIM]
        v = y[..., (hq + hkv) * HEAD_DIM:]
        out = _causal_attention(q.reshape(B, S, hq, HEAD_DIM), k.reshape(B, S, hkv, HEAD_DIM),
                                v.reshape(B, S, hkv, HEAD_DIM))
        return lax.psum(out.reshape(B, S, -1) @ wo, "tp")

    fn = jax.shard_map(shard_fn, mesh=mesh, in_specs=(P(None, "tp", None), P("tp", None), P()),
                       out_specs=P())
    return fn(_interleave_for_tp(params["wqkv"], tp), params["wo"], x)


def gqa_tp_v2(params, x, mesh):
    tp = mesh.shape["tp"]
    hq, hkv = Q_HEADS // tp, KV_HEADS // tp
    q_width, kv_width = hq * HEAD_DIM, hkv * HEAD_DIM

    def shard_fn(w, wo, x):
        y = jnp.einsum("bsd,dc->bsc", x, w[:, 0, :])
        q = y[..., :q_width]
        k = y[..., :kv_width]
        v = y[..., q_width + kv_width:]
        out = _causal_attention(q.reshape(B, S, hq, HEAD_DIM), k.reshape(B, S, hkv, HEAD_DIM),
                                v.reshape(B, S, hkv, HEAD_DIM))
        return lax.psum(jnp.einsum("bsc,cd->bsd", out.reshape(B, S, q_width), wo), "tp")

    fn = jax.shard_map(shard_fn, mesh=mesh, in_specs=(P(None, "tp", None), P("tp", None), P()),
                       out_specs=P())
    return fn(_interleave_for_tp(params["wqkv"], tp), params["wo"], x)
