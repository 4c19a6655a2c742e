"""GQA with one Llama-style fused kernel w[D, (H + 2*KV) * HD] = [q heads | k heads | v heads].

Query head h reads kv head h // G (jnp.repeat). `gqa_tp_offsets`: shard_map on {tp: 2}; the fused
kernel is replicated and every rank cuts its q, k and v column ranges at axis_index offsets, wo rows
over tp, psum. `gqa_jit`: jit with the fused projection split with jnp.split, heads constrained over
tp and the kv heads broadcast to query heads by a grouped reshape.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, T, D, H, KV, HD = 2, 16, 32, 8, 2, 8
G = H // KV
NT = 2
HL, KVL = H // NT, KV // NT


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w": f(D, (H + 2 * KV) * HD), "wo": f(H * HD, D)}, f(B, T, D)


def _attend(q, k, v):
    s = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(HD)
    t = jnp.arange(q.shape[1])
    s = jnp.where(t[:, None] >= t[None, :], s, -1e30)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, -1), v)


def gqa(p, x):
    qkv = x @ p["w"] / math.sqrt(D)
    q = qkv[..., :H * HD].reshape(B, T, H, HD)
    k = qkv[..., H * HD:(H + KV) * HD].reshape(B, T, KV, HD)
    v = qkv[..., (H + KV) * HD:].reshape(B, T, KV, HD)
    o = _attend(q, jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2))
    return o.reshape(B, T, H * HD) @ p["wo"] / math.sqrt(H * HD)


def _cols(w, start, width):
    return lax.dynamic_slice_in_dim(w, start, width, axis=1)


def _local(p, x, v_start):
    r = lax.axis_index("tp")
    w = p["w"]
    q = (x @ _cols(w, r * HL * HD, HL * HD) / math.sqrt(D)).reshape(B, T, HL, HD)
    k = (x @ _cols(w, H * HD + r * KVL * HD, KVL * HD) / math.sqrt(D)).reshape(B, T, KVL, HD)
    v = (x @ _cols(w, v_start(r), KVL * HD) / math.sqrt(D)).reshape(B, T, KVL, HD)
    o = _attend(q, jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2))
    return lax.psum(o.reshape(B, T, HL * HD) @ p["wo"] / math.sqrt(H * HD), "tp")


def _run(v_start, p, x, mesh):
    return jax.shard_map(lambda p, x: _local(p, x, v_start), mesh=mesh,
                         in_specs=({"w": P(), "wo": P("tp", None)}, P()), out_specs=P(),
                         check_vma=False)(p, x)


def gqa_tp_offsets(p, x, mesh):
    return _run(lambda r: (H + KV) * HD + r * KVL * HD, p, x, mesh)


def gqa_tp_offsets_v_from_k(p, x, mesh):
    return _run(lambda r: H * HD + r * KVL * HD, p, x, mesh)


def _jit_gqa(p, x, mesh, expand):
    heads = NamedSharding(mesh, P(None, None, "tp", None))
    q, k, v = jnp.split(x @ p["w"] / math.sqrt(D), [H * HD, (H + KV) * HD], axis=-1)
    q = lax.with_sharding_constraint(q.reshape(B, T, H, HD), heads)
    k = expand(k.reshape(B, T, KV, HD))
    v = expand(v.reshape(B, T, KV, HD))
    o = _attend(q, lax.with_sharding_constraint(k, heads), lax.with_sharding_constraint(v, heads))
    return o.reshape(B, T, H * HD) @ p["wo"] / math.sqrt(H * HD)


def _grouped(kv):
    return jnp.broadcast_to(kv[:, :, :, None], (B, T, KV, G, HD)).reshape(B, T, H, HD)


def _tiled(kv):
    return jnp.tile(kv, (1, 1, G, 1))


def gqa_jit(p, x, mesh):
    return jax.jit(lambda p, x: _jit_gqa(p, x, mesh, _grouped))(p, x)


def gqa_jit_tiled_kv(p, x, mesh):
    return jax.jit(lambda p, x: _jit_gqa(p, x, mesh, _tiled))(p, x)
