"""Grouped-query attention under tensor parallelism.

With at least as many KV heads as shards, wk/wv are column-parallel like wq. With fewer KV
heads than shards (Llama-70B: 8 KV heads at TP=16), the KV heads are replicated: every shard
gets the full wk/wv and cuts out the one KV head its query heads belong to.
"""

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from common import causal_attention, repeat_kv, spec

B, S, D, HEAD_DIM = 2, 8, 32, 8
TP = "tp"


def make_gqa(n_heads, n_kv_heads):
    def gqa(x, wq, wk, wv, wo):
        b, s, _ = x.shape
        q = (x @ wq).reshape(b, s, n_heads, HEAD_DIM)
        k = (x @ wk).reshape(b, s, n_kv_heads, HEAD_DIM)
        v = (x @ wv).reshape(b, s, n_kv_heads, HEAD_DIM)
        rep = n_heads // n_kv_heads
        o = causal_attention(q, repeat_kv(k, rep), repeat_kv(v, rep))
        return o.reshape(b, s, -1) @ wo

    def inputs():
        q_dim, kv_dim = n_heads * HEAD_DIM, n_kv_heads * HEAD_DIM
        return (spec(B, S, D), spec(D, q_dim), spec(D, kv_dim), spec(D, kv_dim), spec(q_dim, D))

    return gqa, inputs


# 8 query heads, 2 KV heads (fewer than the 4 shards); 8 query heads, 4 KV heads at TP=2.
gqa_h8_kv2, inputs_h8_kv2 = make_gqa(8, 2)
gqa_h8_kv4, inputs_h8_kv4 = make_gqa(8, 4)
N_HEADS, N_KV_SMALL, N_KV_LARGE = 8, 2, 4


def gqa_tp_sharded_kv(x, wq, wk, wv, wo, *, mesh):
    """n_kv_heads >= tp: every shard owns whole KV heads, split like the query heads."""
    rep = N_HEADS // N_KV_LARGE

    def body(x, wq, wk, wv, wo):
        b, s, _ = x.shape
        q = (x @ wq).reshape(b, s, -1, HEAD_DIM)
        k = (x @ wk).reshape(b, s, -1, HEAD_DIM)
        v = (x @ wv).reshape(b, s, -1, HEAD_DIM)
        o = causal_attention(q, repeat_kv(k, rep), repeat_kv(v, rep))
        return lax.psum(o.reshape(b, s, -1) @ wo, TP)

    col, row = P(None, TP), P(TP, None)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), col, col, col, row), out_specs=P())(x, wq, wk, wv, wo)


def gqa_tp_replicated_kv(x, wq, wk, wv, wo, *, mesh):
    """n_kv_heads < tp: wk/wv replicated, each shard slices the KV head of its query heads."""
    tp = mesh.shape[TP]
    q_per_shard = N_HEADS // tp
    group = N_HEADS // N_KV_SMALL  # query heads per KV head

    def body(x, wq, wk, wv, wo):
        b, s, _ = x.shape
        i = lax.axis_index(TP)
        kv_head = (i * q_per_shard) // group
        wk_i = lax.dynamic_slice_in_dim(wk, kv_head * HEAD_DIM, HEAD_DIM, axis=1)
        wv_i = lax.dynamic_slice_in_dim(wv, kv_head * HEAD_DIM, HEAD_DIM, axis=1)
        q = (x @ wq).reshape(b, s, q_per_shard, HEAD_DIM)
        k = (x @ wk_i).reshape(b, s, 1, HEAD_DIM)
        v = (x @ wv_i).reshape(b, s, 1, HEAD_DIM)
        o = causal_attention(q, repeat_kv(k, q_per_shard), repeat_kv(v, q_per_shard))
        return lax.psum(o.reshape(b, s, -1) @ wo, TP)

    col, row = P(None, TP), P(TP, None)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), col, P(), P(), row), out_specs=P())(x, wq, wk, wv, wo)


def gqa_tp_replicated_kv_round_robin(x, wq, wk, wv, wo, *, mesh):
    tp = mesh.shape[TP]
    q_per_shard = N_HEADS // tp

    def body(x, wq, wk, wv, wo):
        b, s, _ = x.shape
        i = lax.axis_index(TP)
        kv_head = i % N_KV_SMALL  # BUG: KV heads assigned round-robin; query heads 2i, 2i+1 belong to KV head i // 2
        wk_i = lax.dynamic_slice_in_dim(wk, kv_head * HEAD_DIM, HEAD_DIM, axis=1)
        wv_i = lax.dynamic_slice_in_dim(wv, kv_head * HEAD_DIM, HEAD_DIM, axis=1)
        q = (x @ wq).reshape(b, s, q_per_shard, HEAD_DIM)
        k = (x @ wk_i).reshape(b, s, 1, HEAD_DIM)
        v = (x @ wv_i).reshape(b, s, 1, HEAD_DIM)
        o = causal_attention(q, repeat_kv(k, q_per_shard), repeat_kv(v, q_per_shard))
        return lax.psum(o.reshape(b, s, -1) @ wo, TP)

    col, row = P(None, TP), P(TP, None)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), col, P(), P(), row), out_specs=P())(x, wq, wk, wv, wo)
