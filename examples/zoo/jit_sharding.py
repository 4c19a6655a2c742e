"""GSPMD style: no shard_map. The model is written on global shapes and annotated with
with_sharding_constraint; XLA's SPMD partitioner inserts the collectives.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from common import causal_attention, spec

B, S, D, F = 2, 8, 32, 64
N_HEADS, HEAD_DIM = 4, 8
HD = N_HEADS * HEAD_DIM
TP = "tp"


def block(x, wq, wk, wv, wo, w1, w2):
    b, s, _ = x.shape
    heads = lambda t: t.reshape(b, s, N_HEADS, HEAD_DIM)
    o = causal_attention(heads(x @ wq), heads(x @ wk), heads(x @ wv))
    x = x + o.reshape(b, s, HD) @ wo
    return x + jax.nn.gelu(x @ w1) @ w2


def inputs():
    return (spec(B, S, D), spec(D, HD), spec(D, HD), spec(D, HD), spec(HD, D), spec(D, F), spec(F, D))


def block_gspmd(x, wq, wk, wv, wo, w1, w2, *, mesh):
    shard = lambda t, *s: jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P(*s)))
    b, s, _ = x.shape
    wq, wk, wv, w1 = (shard(w, None, TP) for w in (wq, wk, wv, w1))
    wo, w2 = (shard(w, TP, None) for w in (wo, w2))
    heads = lambda t: shard(t.reshape(b, s, N_HEADS, HEAD_DIM), None, None, TP, None)  # heads split over tp
    o = causal_attention(heads(x @ wq), heads(x @ wk), heads(x @ wv))
    x = shard(x + o.reshape(b, s, HD) @ wo, None, None, None)
    h = shard(jax.nn.gelu(x @ w1), None, None, TP)
    return shard(x + h @ w2, None, None, None)


def block_gspmd_head_major(x, wq, wk, wv, wo, w1, w2, *, mesh):
    shard = lambda t, *s: jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P(*s)))
    b, s, _ = x.shape
    wq, wk, wv, w1 = (shard(w, None, TP) for w in (wq, wk, wv, w1))
    wo, w2 = (shard(w, TP, None) for w in (wo, w2))
    heads = lambda t: shard(t.reshape(b, s, HEAD_DIM, N_HEADS).swapaxes(2, 3), None, None, TP, None)  # BUG: splits the projection as (head_dim, heads); the weights' layout is (heads, head_dim)
    o = causal_attention(heads(x @ wq), heads(x @ wk), heads(x @ wv))
    x = shard(x + o.reshape(b, s, HD) @ wo, None, None, None)
    h = shard(jax.nn.gelu(x @ w1), None, None, TP)
    return shard(x + h @ w2, None, None, None)
