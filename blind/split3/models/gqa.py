"""Grouped-query attention, 8 query heads sharing 2 key/value heads, tensor parallel over 4 ranks.

The fused projection is laid out [q heads | k heads | v heads] along its output columns. Each rank
owns 2 query heads and picks the one kv head those query heads read (kv heads are replicated across
the ranks of a group rather than split).
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, EMBED = 2, 8, 32
N_Q, N_KV, HEAD = 8, 2, 8
TP = 4
Q_PER_RANK = N_Q // TP
RANKS_PER_KV = TP // N_KV


def _attend(q, k, v):
    # q: [b, s, hq, d]; k, v: [b, s, hkv, d], hq a multiple of hkv
    group = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, group, axis=2)
    v = jnp.repeat(v, group, axis=2)
    logits = jnp.einsum("bshd,bthd->bhst", q, k) * HEAD**-0.5
    causal = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    logits = jnp.where(causal, logits, -1e30)
    return jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(logits, axis=-1), v)


def gqa(x, w_fused, w_o):
    proj = x @ w_fused
    q, k, v = jnp.split(proj, [N_Q * HEAD, (N_Q + N_KV) * HEAD], axis=-1)
    q = q.reshape(BATCH, SEQ, N_Q, HEAD)
    k = k.reshape(BATCH, SEQ, N_KV, HEAD)
    v = v.reshape(BATCH, SEQ, N_KV, HEAD)
    out = _attend(q, k, v).reshape(BATCH, SEQ, N_Q * HEAD)
    return out @ w_o


def gqa_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((BATCH, SEQ, EMBED), f32),
        jax.ShapeDtypeStruct((EMBED, (N_Q + 2 * N_KV) * HEAD), f32),
        jax.ShapeDtypeStruct((N_Q * HEAD, EMBED), f32),
    )


def _columns(w, start, width):
    return lax.dynamic_slice_in_dim(w, start, width, axis=1)


def gqa_tp(x, w_fused, w_o, mesh):
    def rank_fn(xr, w, wo_rows):
        rank = lax.axis_index("tp")
        kv_head = rank // RANKS_PER_KV
        wq = _columns(w, rank * Q_PER_RANK * HEAD, Q_PER_RANK * HEAD)
        wk = _columns(w, N_Q * HEAD + kv_head * HEAD, HEAD)
        wv = _columns(w, (N_Q + N_KV) * HEAD + kv_head * HEAD, HEAD)
        q = (xr @ wq).reshape(BATCH, SEQ, Q_PER_RANK, HEAD)
        k = (xr @ wk).reshape(BATCH, SEQ, 1, HEAD)
        v = (xr @ wv).reshape(BATCH, SEQ, 1, HEAD)
        out = _attend(q, k, v).reshape(BATCH, SEQ, Q_PER_RANK * HEAD)
        return lax.psum(out @ wo_rows, "tp")

    return jax.shard_map(rank_fn, mesh=mesh, in_specs=(P(), P(), P("tp", None)), out_specs=P())(x, w_fused, w_o)


def gqa_tp_kv_modulo(x, w_fused, w_o, mesh):
    def rank_fn(xr, w, wo_rows):
        rank = lax.axis_index("tp")
        kv_head = rank % N_KV
        wq = _columns(w, rank * Q_PER_RANK * HEAD, Q_PER_RANK * HEAD)
        wk = _columns(w, N_Q * HEAD + kv_head * HEAD, HEAD)
        wv = _columns(w, (N_Q + N_KV) * HEAD + kv_head * HEAD, HEAD)
        q = (xr @ wq).reshape(BATCH, SEQ, Q_PER_RANK, HEAD)
        k = (xr @ wk).reshape(BATCH, SEQ, 1, HEAD)
        v = (xr @ wv).reshape(BATCH, SEQ, 1, HEAD)
        out = _attend(q, k, v).reshape(BATCH, SEQ, Q_PER_RANK * HEAD)
        return lax.psum(out @ wo_rows, "tp")

    return jax.shard_map(rank_fn, mesh=mesh, in_specs=(P(), P(), P("tp", None)), out_specs=P())(x, w_fused, w_o)
