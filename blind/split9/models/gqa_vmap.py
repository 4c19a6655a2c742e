"""Grouped-query attention; the TP version maps a per-KV-group function with jax.vmap.

8 query heads share 2 KV heads (4 query heads per group); 4 tensor-parallel shards each own 2
query heads, so each shard needs the one KV head of its group: K/V weights stay replicated and the
shard picks its group's columns.
"""
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

N_HEADS, N_KV, HEAD_DIM, D_MODEL = 8, 2, 4, 32
GROUP = N_HEADS // N_KV


def shapes():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return (f(2, 6, D_MODEL),
            dict(wq=f(D_MODEL, N_HEADS * HEAD_DIM), wk=f(D_MODEL, N_KV * HEAD_DIM),
                 wv=f(D_MODEL, N_KV * HEAD_DIM), wo=f(N_HEADS * HEAD_DIM, D_MODEL)))


def gqa(x, p):
    b, s, _ = x.shape
    q = (x @ p["wq"]).reshape(b, s, N_HEADS, HEAD_DIM)
    k = jnp.repeat((x @ p["wk"]).reshape(b, s, N_KV, HEAD_DIM), GROUP, axis=2)
    v = jnp.repeat((x @ p["wv"]).reshape(b, s, N_KV, HEAD_DIM), GROUP, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HEAD_DIM).astype(x.dtype)
    causal = jnp.tril(jnp.ones((s, s), bool))
    w = jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", w, v)
    return o.reshape(b, s, -1) @ p["wo"]


def one_head(q, k, v):
    """q, k, v: [seq, head_dim] for one query head and its KV head."""
    s = q.shape[0]
    scores = q @ k.T / jnp.sqrt(jnp.float32(HEAD_DIM))
    scores = jnp.where(jnp.arange(s)[:, None] >= jnp.arange(s)[None, :], scores, -jnp.inf)
    return jax.nn.softmax(scores) @ v


# [batch] x [heads] of one_head; K/V are shared by every head of the shard
heads_fn = jax.vmap(jax.vmap(one_head, in_axes=(1, None, None), out_axes=1), in_axes=(0, 0, 0))


def _local(x, wq, wk_all, wv_all, wo, *, group_of_shard):
    b, s, _ = x.shape
    g = group_of_shard(jax.lax.axis_index("tp"))
    wk = jax.lax.dynamic_slice_in_dim(wk_all, g * HEAD_DIM, HEAD_DIM, axis=1)
    wv = jax.lax.dynamic_slice_in_dim(wv_all, g * HEAD_DIM, HEAD_DIM, axis=1)
    q = (x @ wq).reshape(b, s, -1, HEAD_DIM)
    o = heads_fn(q, x @ wk, x @ wv)
    return jax.lax.psum(o.reshape(b, s, -1) @ wo, "tp")


def _gqa_tp(x, p, mesh, group_of_shard):
    fn = jax.shard_map(functools.partial(_local, group_of_shard=group_of_shard), mesh=mesh,
                       in_specs=(P(), P(None, "tp"), P(), P(), P("tp", None)), out_specs=P())
    return fn(x, p["wq"], p["wk"], p["wv"], p["wo"])


def gqa_tp(x, p, mesh):
    shards_per_group = mesh.shape["tp"] // N_KV
    return _gqa_tp(x, p, mesh, lambda i: i // shards_per_group)


def gqa_tp_modulo(x, p, mesh):
    return _gqa_tp(x, p, mesh, lambda i: i % N_KV)
