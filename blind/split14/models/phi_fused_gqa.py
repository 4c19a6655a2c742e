"""Phi-3-style grouped-query attention with one fused projection kernel `qkv_proj` [D, (H + 2*KV) * HD]
laid out [all q heads | all k heads | all v heads]; queries are grouped as [KV, G, HD] and attend
to their group's key/value head with a grouped einsum; causal, bias-free; out projection [H*HD, D].

Tensor parallel over {tp: 4} (8 query heads, 2 kv heads: two devices share one kv head).
- `gqa_tp_fused_slices`: the fused kernel is passed whole; each device cuts its q columns and its
  group's k / v columns with `lax.dynamic_slice_in_dim` at offsets computed from `axis_index`;
- `gqa_tp_repeat_kv`: the kernel is split outside the shard_map with `jnp.split`, q columns sharded
  by in_specs, k / v expanded to one head per query head with `jnp.repeat` and the device's two
  heads cut with `dynamic_slice_in_dim`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, KV, HD = 2, 8, 32, 8, 2, 4
G = H // KV
TP = 4
H_LOCAL = H // TP
DEV_PER_KV = TP // KV


def gqa_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"qkv_proj": f(D, (H + 2 * KV) * HD), "o_proj": f(H * HD, D)}, f(B, S, D)


def _mask(n):
    return jnp.tril(jnp.ones((n, n), dtype=bool))


def grouped_attention(q, k, v):
    """q [B, S, kv, g, HD]; k, v [B, S, kv, HD] -> [B, S, kv * g * HD]."""
    s = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / jnp.sqrt(float(HD))
    s = jnp.where(_mask(S), s, -jnp.inf)
    o = jnp.einsum("bkgqs,bskd->bqkgd", jax.nn.softmax(s, axis=-1), v)
    return o.reshape(o.shape[0], o.shape[1], -1)


def gqa(params, x):
    qkv = x @ params["qkv_proj"]
    q, k, v = jnp.split(qkv, [H * HD, (H + KV) * HD], axis=-1)
    q = q.reshape(B, S, KV, G, HD)
    k = k.reshape(B, S, KV, HD)
    v = v.reshape(B, S, KV, HD)
    return grouped_attention(q, k, v) @ params["o_proj"]


# ---- fused kernel sliced per device -------------------------------------------------------------

def _local_qkv_kernels(w, idx, kv_head):
    wq = lax.dynamic_slice_in_dim(w, idx * H_LOCAL * HD, H_LOCAL * HD, axis=1)
    wk = lax.dynamic_slice_in_dim(w, (H + kv_head) * HD, HD, axis=1)
    wv = lax.dynamic_slice_in_dim(w, (H + KV + kv_head) * HD, HD, axis=1)
    return wq, wk, wv


def _fused_slices(group_of):
    def local(qkv_proj, o_proj, x):
        idx = lax.axis_index("tp")
        wq, wk, wv = _local_qkv_kernels(qkv_proj, idx, group_of(idx))
        q = (x @ wq).reshape(B, S, 1, H_LOCAL, HD)
        k = (x @ wk).reshape(B, S, 1, HD)
        v = (x @ wv).reshape(B, S, 1, HD)
        return lax.psum(grouped_attention(q, k, v) @ o_proj, "tp")
    return local


def _run_fused(group_of, params, x, mesh):
    return jax.shard_map(_fused_slices(group_of), mesh=mesh, in_specs=(P(), P("tp"), P()),
                         out_specs=P())(params["qkv_proj"], params["o_proj"], x)


def gqa_tp_fused_slices(params, x, mesh):
    return _run_fused(lambda idx: idx // DEV_PER_KV, params, x, mesh)


def gqa_tp_fused_slices_group_modulo(params, x, mesh):
    return _run_fused(lambda idx: idx % KV, params, x, mesh)


# ---- split outside, kv repeated per query head --------------------------------------------------

def _expand_kv(t):
    return jnp.repeat(t.reshape(B, S, KV, HD), G, axis=2)


def _expand_kv_tiled(t):
    return jnp.tile(t.reshape(B, S, KV, HD), (1, 1, G, 1))


def _repeat_kv_local(expand):
    def local(wq, wk, wv, o_proj, x):
        idx = lax.axis_index("tp")
        q = (x @ wq).reshape(B, S, H_LOCAL, 1, HD)
        k = lax.dynamic_slice_in_dim(expand(x @ wk), idx * H_LOCAL, H_LOCAL, axis=2)
        v = lax.dynamic_slice_in_dim(expand(x @ wv), idx * H_LOCAL, H_LOCAL, axis=2)
        return lax.psum(grouped_attention(q, k, v) @ o_proj, "tp")
    return local


def _run_repeat(expand, params, x, mesh):
    wq, wk, wv = jnp.split(params["qkv_proj"], [H * HD, (H + KV) * HD], axis=-1)
    return jax.shard_map(_repeat_kv_local(expand), mesh=mesh,
                         in_specs=(P(None, "tp"), P(), P(), P("tp"), P()),
                         out_specs=P())(wq, wk, wv, params["o_proj"], x)


def gqa_tp_repeat_kv(params, x, mesh):
    return _run_repeat(_expand_kv, params, x, mesh)


def gqa_tp_tile_kv(params, x, mesh):
    return _run_repeat(_expand_kv_tiled, params, x, mesh)
