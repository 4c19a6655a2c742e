"""Bias-free grouped-query attention with fused QKV projections, in two checkpoint layouts.

1. Falcon-40B layout: the fused weight's columns are grouped per KV head - for each of the KV
   groups, its G query heads, then its key head, then its value head ([D, KV * (G + 2) * HD]).
   Because the layout is group-major, a plain column shard over `tp` holds whole groups; the
   sharded attention core is written separately with `lax.dot_general` by the serving team.
2. Llama/vLLM layout: [D, (H + 2 * KV) * HD] = [all q heads | all k heads | all v heads]; the
   weight enters replicated and every shard slices its q, k and v column blocks (QKVParallelLinear
   style), then repeats its K/V heads over the query group (`repeat_kv`).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, KV, HD = 2, 8, 32, 8, 4, 8
G = H // KV
NEG = -1e30


def _causal_softmax(scores):
    mask = jnp.tril(jnp.ones((S, S), dtype=bool))
    return jax.nn.softmax(jnp.where(mask, scores, NEG), axis=-1)


# ---- Falcon grouped layout --------------------------------------------------------------------

def falcon_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"query_key_value": f(D, KV * (G + 2) * HD), "dense": f(H * HD, D)}, f(B, S, D)


def falcon_attention(params, x):
    fused = (x @ params["query_key_value"]).reshape(B, S, KV, G + 2, HD)
    q, k, v = fused[..., :G, :], fused[..., G, :], fused[..., G + 1, :]
    scores = jnp.einsum("...qkgd,...skd->...kgqs", q, k) / jnp.sqrt(HD)
    ctx = jnp.einsum("...kgqs,...skd->...qkgd", _causal_softmax(scores), v)
    return ctx.reshape(B, S, H * HD) @ params["dense"]


def _local_falcon(w_qkv, w_dense, x, diag_offset):
    kv_local = w_qkv.shape[1] // ((G + 2) * HD)
    fused = jnp.dot(x, w_qkv).reshape(B, S, kv_local, G + 2, HD)
    q = fused[:, :, :, :G].transpose(0, 2, 3, 1, 4)          # b k g q d
    k = fused[:, :, :, G].transpose(0, 2, 1, 3)              # b k s d
    v = fused[:, :, :, G + 1].transpose(0, 2, 1, 3)
    scores = lax.dot_general(q, k, (((4,), (3,)), ((0, 1), (0, 1)))) * HD ** -0.5
    masked = jnp.triu(jnp.ones((S, S), dtype=bool), k=diag_offset)
    probs = jax.nn.softmax(jnp.where(masked, NEG, scores), axis=-1)
    ctx = lax.dot_general(probs, v, (((4,), (2,)), ((0, 1), (0, 1))))   # b k g q d
    ctx = ctx.transpose(0, 3, 1, 2, 4).reshape(B, S, kv_local * G * HD)
    return lax.psum(jnp.dot(ctx, w_dense), "tp")


def _falcon_tp(params, x, mesh, diag_offset):
    local = functools.partial(_local_falcon, diag_offset=diag_offset)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P()),
                       out_specs=P())
    return fn(params["query_key_value"], params["dense"], x)


def falcon_attention_tp(params, x, mesh):
    return _falcon_tp(params, x, mesh, diag_offset=1)


def falcon_attention_tp_diag(params, x, mesh):
    return _falcon_tp(params, x, mesh, diag_offset=0)


# ---- Llama / vLLM [q | k | v] layout ----------------------------------------------------------

def llama_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"qkv_proj": f(D, (H + 2 * KV) * HD), "o_proj": f(H * HD, D)}, f(B, S, D)


def repeat_kv(t, n_rep):
    return jnp.repeat(t, n_rep, axis=2)


def _sdpa(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    return jnp.einsum("bhqk,bkhd->bqhd", _causal_softmax(scores), v)


def llama_attention(params, x):
    qkv = x @ params["qkv_proj"]
    q, k, v = jnp.split(qkv, [H * HD, (H + KV) * HD], axis=-1)
    q = q.reshape(B, S, H, HD)
    k, v = (repeat_kv(t.reshape(B, S, KV, HD), G) for t in (k, v))
    return _sdpa(q, k, v).reshape(B, S, H * HD) @ params["o_proj"]


def _q_cols(i, hl, kvl):
    return i * hl * HD


def _k_cols(i, hl, kvl):
    return H * HD + i * kvl * HD


def _v_cols(i, hl, kvl):
    return (H + KV) * HD + i * kvl * HD


def _v_cols_q_stride(i, hl, kvl):
    return (H + KV) * HD + i * hl * HD


def _llama_tp_local(w_qkv, w_o, x, v_cols):
    n, i = lax.axis_size("tp"), lax.axis_index("tp")
    hl, kvl = H // n, KV // n
    cut = lambda start, width: lax.dynamic_slice_in_dim(w_qkv, start, width, axis=1)
    q = (x @ cut(_q_cols(i, hl, kvl), hl * HD)).reshape(B, S, hl, HD)
    k = (x @ cut(_k_cols(i, hl, kvl), kvl * HD)).reshape(B, S, kvl, HD)
    v = (x @ cut(v_cols(i, hl, kvl), kvl * HD)).reshape(B, S, kvl, HD)
    ctx = _sdpa(q, repeat_kv(k, G), repeat_kv(v, G)).reshape(B, S, hl * HD)
    w_o_rows = lax.dynamic_slice_in_dim(w_o, i * hl * HD, hl * HD, axis=0)
    return lax.psum(ctx @ w_o_rows, "tp")


def _llama_tp(params, x, mesh, v_cols):
    fn = jax.shard_map(functools.partial(_llama_tp_local, v_cols=v_cols), mesh=mesh,
                       in_specs=(P(), P(), P()), out_specs=P())
    return fn(params["qkv_proj"], params["o_proj"], x)


def llama_attention_tp(params, x, mesh):
    return _llama_tp(params, x, mesh, v_cols=_v_cols)


def llama_attention_tp_v_offset(params, x, mesh):
    return _llama_tp(params, x, mesh, v_cols=_v_cols_q_stride)
