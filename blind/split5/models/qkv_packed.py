"""Causal GQA attention with one fused projection laid out [q heads | k heads | v heads].

The tensor-parallel version keeps the fused weight whole on every device and cuts each device's
q, k and v heads out of it with dynamic slices at the device's offsets.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, DIM = 2, 8, 32
N_HEADS, N_KV, HEAD_DIM = 4, 2, 8
TP = 2
Q_LOCAL, KV_LOCAL = N_HEADS // TP, N_KV // TP


def make_inputs():
    f = jnp.float32
    params = {"wqkv": jax.ShapeDtypeStruct((DIM, (N_HEADS + 2 * N_KV) * HEAD_DIM), f),
              "wo": jax.ShapeDtypeStruct((N_HEADS * HEAD_DIM, DIM), f)}
    return params, jax.ShapeDtypeStruct((BATCH, SEQ, DIM), f)


def _attend(q, k, v):
    group = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, group, axis=2)
    v = jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HEAD_DIM ** -0.5
    causal = jnp.tril(jnp.ones((SEQ, SEQ), dtype=bool))
    scores = jnp.where(causal, scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def attention(params, x):
    qkv = x @ params["wqkv"]
    q, k, v = jnp.split(qkv, [N_HEADS * HEAD_DIM, (N_HEADS + N_KV) * HEAD_DIM], axis=-1)
    q = q.reshape(BATCH, SEQ, N_HEADS, HEAD_DIM)
    k = k.reshape(BATCH, SEQ, N_KV, HEAD_DIM)
    v = v.reshape(BATCH, SEQ, N_KV, HEAD_DIM)
    o = _attend(q, k, v).reshape(BATCH, SEQ, N_HEADS * HEAD_DIM)
    return o @ params["wo"]


def attention_tp(params, x, mesh):
    def shard(wqkv, wo, x):
        r = lax.axis_index("tp")
        wq = lax.dynamic_slice_in_dim(wqkv, r * Q_LOCAL * HEAD_DIM, Q_LOCAL * HEAD_DIM, axis=1)
        wk = lax.dynamic_slice_in_dim(wqkv, N_HEADS * HEAD_DIM + r * KV_LOCAL * HEAD_DIM,
                                      KV_LOCAL * HEAD_DIM, axis=1)
        wv = lax.dynamic_slice_in_dim(wqkv, (N_HEADS + N_KV) * HEAD_DIM + r * KV_LOCAL * HEAD_DIM,
                                      KV_LOCAL * HEAD_DIM, axis=1)
        q = (x @ wq).reshape(BATCH, SEQ, Q_LOCAL, HEAD_DIM)
        k = (x @ wk).reshape(BATCH, SEQ, KV_LOCAL, HEAD_DIM)
        v = (x @ wv).reshape(BATCH, SEQ, KV_LOCAL, HEAD_DIM)
        o = _attend(q, k, v).reshape(BATCH, SEQ, Q_LOCAL * HEAD_DIM)
        return lax.psum(o @ wo, "tp")

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P("tp", None), P()), out_specs=P())(
        params["wqkv"], params["wo"], x)


def attention_tp_k_stride(params, x, mesh):
    def shard(wqkv, wo, x):
        r = lax.axis_index("tp")
        wq = lax.dynamic_slice_in_dim(wqkv, r * Q_LOCAL * HEAD_DIM, Q_LOCAL * HEAD_DIM, axis=1)
        wk = lax.dynamic_slice_in_dim(wqkv, N_HEADS * HEAD_DIM + r * Q_LOCAL * HEAD_DIM,
                                      KV_LOCAL * HEAD_DIM, axis=1)
        wv = lax.dynamic_slice_in_dim(wqkv, (N_HEADS + N_KV) * HEAD_DIM + r * KV_LOCAL * HEAD_DIM,
                                      KV_LOCAL * HEAD_DIM, axis=1)
        q = (x @ wq).reshape(BATCH, SEQ, Q_LOCAL, HEAD_DIM)
        k = (x @ wk).reshape(BATCH, SEQ, KV_LOCAL, HEAD_DIM)
        v = (x @ wv).reshape(BATCH, SEQ, KV_LOCAL, HEAD_DIM)
        o = _attend(q, k, v).reshape(BATCH, SEQ, Q_LOCAL * HEAD_DIM)
        return lax.psum(o @ wo, "tp")

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P("tp", None), P()), out_specs=P())(
        params["wqkv"], params["wo"], x)
