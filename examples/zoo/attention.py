"""Megatron tensor-parallel multi-head attention.

Heads are split across the `tp` axis: wq, wk, wv are column-parallel (each shard owns whole
heads), wo is row-parallel, and the partial outputs are summed with one psum.
"""

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from common import causal_attention, spec

B, S, D = 2, 8, 32
N_HEADS, HEAD_DIM = 4, 8
TP = "tp"


def attention(x, wq, wk, wv, wo):
    b, s, _ = x.shape
    q = (x @ wq).reshape(b, s, N_HEADS, HEAD_DIM)
    k = (x @ wk).reshape(b, s, N_HEADS, HEAD_DIM)
    v = (x @ wv).reshape(b, s, N_HEADS, HEAD_DIM)
    o = causal_attention(q, k, v).reshape(b, s, N_HEADS * HEAD_DIM)
    return o @ wo


def inputs():
    hd = N_HEADS * HEAD_DIM
    return (spec(B, S, D), spec(D, hd), spec(D, hd), spec(D, hd), spec(hd, D))


def attention_tp(x, wq, wk, wv, wo, *, mesh):
    def body(x, wq, wk, wv, wo):
        b, s, _ = x.shape
        q = (x @ wq).reshape(b, s, -1, HEAD_DIM)  # the local heads
        k = (x @ wk).reshape(b, s, -1, HEAD_DIM)
        v = (x @ wv).reshape(b, s, -1, HEAD_DIM)
        o = causal_attention(q, k, v).reshape(b, s, -1)
        return lax.psum(o @ wo, TP)

    col, row = P(None, TP), P(TP, None)
    return jax.shard_map(
        body, mesh=mesh, in_specs=(P(), col, col, col, row), out_specs=P(),
    )(x, wq, wk, wv, wo)


def attention_tp_global_heads(x, wq, wk, wv, wo, *, mesh):
    def body(x, wq, wk, wv, wo):
        b, s, _ = x.shape
        head_dim = wq.shape[1] // N_HEADS  # BUG: global head count on the local shard: head_dim comes out HEAD_DIM / tp
        q = (x @ wq).reshape(b, s, N_HEADS, head_dim)
        k = (x @ wk).reshape(b, s, N_HEADS, head_dim)
        v = (x @ wv).reshape(b, s, N_HEADS, head_dim)
        o = causal_attention(q, k, v).reshape(b, s, -1)
        return lax.psum(o @ wo, TP)

    col, row = P(None, TP), P(TP, None)
    return jax.shard_map(
        body, mesh=mesh, in_specs=(P(), col, col, col, row), out_specs=P(),
    )(x, wq, wk, wv, wo)
