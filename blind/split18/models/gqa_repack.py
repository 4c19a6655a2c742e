"""Qwen2-style grouped-query attention with a fused, biased QKV projection in the standard
checkpoint layout [D, (H + 2 * KV) * HD] = [all q heads | all k heads | all v heads] plus a fused
bias, 8 query heads sharing 2 kv heads, causal, output projection [H * HD, D].

- `gqa_tp_repacked`: on {tp: 2}: outside shard_map the fused weight and bias are re-packed
  Megatron-style so that each tp rank's [q_r | k_r | v_r] columns are contiguous; a plain column
  shard of the re-packed tensor then gives every rank its 4 query heads and its kv head;
- `gqa_jit_grouped`: on {data: 2, model: 2}: no shard_map; the fused projection is cut by explicit
  column offsets (weight and bias separately), queries are viewed as [B, S, KV, G, HD] and
  `with_sharding_constraint` puts the kv-group dim on `model`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, H, KV, HD = 4, 8, 32, 8, 2, 4
G = H // KV
TP = 2


def gqa_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"c_attn.w": f(D, (H + 2 * KV) * HD), "c_attn.b": f((H + 2 * KV) * HD),
            "o_proj": f(H * HD, D)}, f(B, S, D)


def _attention(q, k, v):
    """q [b, s, h, hd]; k, v [b, s, kv, hd] with h = kv * G (query head i uses kv head i // G)."""
    s = q.shape[1]
    k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
    v = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HD ** -0.5
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def gqa(p, x):
    qkv = x @ p["c_attn.w"] + p["c_attn.b"]
    q, k, v = jnp.split(qkv, [H * HD, (H + KV) * HD], axis=-1)
    ctx = _attention(q.reshape(B, S, H, HD), k.reshape(B, S, KV, HD), v.reshape(B, S, KV, HD))
    return ctx.reshape(B, S, H * HD) @ p["o_proj"]


# ---- tp over a re-packed fused projection ----------------------------------------------------------

def _repack(w):
    lead = w.shape[:-1]
    q, k, v = jnp.split(w, [H * HD, (H + KV) * HD], axis=-1)
    q = q.reshape(*lead, TP, H // TP * HD)
    k = k.reshape(*lead, TP, KV // TP * HD)
    v = v.reshape(*lead, TP, KV // TP * HD)
    return jnp.concatenate([q, k, v], axis=-1).reshape(*lead, -1)


def _repack_head_strided(w):
    lead = w.shape[:-1]
    q, k, v = jnp.split(w, [H * HD, (H + KV) * HD], axis=-1)
    q = q.reshape(*lead, H // TP, TP, HD).swapaxes(-3, -2).reshape(*lead, TP, H // TP * HD)
    k = k.reshape(*lead, TP, KV // TP * HD)
    v = v.reshape(*lead, TP, KV // TP * HD)
    return jnp.concatenate([q, k, v], axis=-1).reshape(*lead, -1)


def _local_gqa(w, b, wo, x):
    hl, kvl = H // TP, KV // TP
    q, k, v = jnp.split(x @ w + b, [hl * HD, (hl + kvl) * HD], axis=-1)
    bl, s = x.shape[:2]
    ctx = _attention(q.reshape(bl, s, hl, HD), k.reshape(bl, s, kvl, HD), v.reshape(bl, s, kvl, HD))
    return lax.psum(ctx.reshape(bl, s, hl * HD) @ wo, "tp")


def gqa_tp_repacked(p, x, mesh):
    w, b = _repack(p["c_attn.w"]), _repack(p["c_attn.b"])
    return jax.shard_map(_local_gqa, mesh=mesh, in_specs=(P(None, "tp"), P("tp"), P("tp", None), P()),
                         out_specs=P(), check_vma=False)(w, b, p["o_proj"], x)


def gqa_tp_repacked_strided_heads(p, x, mesh):
    w, b = _repack_head_strided(p["c_attn.w"]), _repack_head_strided(p["c_attn.b"])
    return jax.shard_map(_local_gqa, mesh=mesh, in_specs=(P(None, "tp"), P("tp"), P("tp", None), P()),
                         out_specs=P(), check_vma=False)(w, b, p["o_proj"], x)


# ---- jit with explicit column offsets ---------------------------------------------------------------

def _cols(t, start, n):
    return lax.slice_in_dim(t, start, start + n, axis=-1)


def _grouped_attention(q, k, v, mesh):
    cons = lambda t, spec: lax.with_sharding_constraint(t, NamedSharding(mesh, spec))
    q = cons(q.reshape(B, S, KV, G, HD), P("data", None, "model", None, None))
    k = cons(k.reshape(B, S, KV, HD), P("data", None, "model", None))
    v = cons(v.reshape(B, S, KV, HD), P("data", None, "model", None))
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) * HD ** -0.5
    scores = jnp.where(jnp.tril(jnp.ones((S, S), bool)), scores, -jnp.inf)
    ctx = jnp.einsum("bkgqs,bskd->bqkgd", jax.nn.softmax(scores, axis=-1), v)
    return cons(ctx, P("data", None, "model", None, None)).reshape(B, S, H * HD)


def gqa_jit_grouped(p, x, mesh):
    w, b = p["c_attn.w"], p["c_attn.b"]
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("data")))
    q = x @ _cols(w, 0, H * HD) + _cols(b, 0, H * HD)
    k = x @ _cols(w, H * HD, KV * HD) + _cols(b, H * HD, KV * HD)
    v = x @ _cols(w, (H + KV) * HD, KV * HD) + _cols(b, (H + KV) * HD, KV * HD)
    out = _grouped_attention(q, k, v, mesh) @ p["o_proj"]
    return lax.with_sharding_constraint(out, NamedSharding(mesh, P("data")))


def gqa_jit_grouped_v_bias_offset(p, x, mesh):
    w, b = p["c_attn.w"], p["c_attn.b"]
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("data")))
    q = x @ _cols(w, 0, H * HD) + _cols(b, 0, H * HD)
    k = x @ _cols(w, H * HD, KV * HD) + _cols(b, H * HD, KV * HD)
    v = x @ _cols(w, (H + KV) * HD, KV * HD) + _cols(b, H * HD, KV * HD)
    out = _grouped_attention(q, k, v, mesh) @ p["o_proj"]
    return lax.with_sharding_constraint(out, NamedSharding(mesh, P("data")))
