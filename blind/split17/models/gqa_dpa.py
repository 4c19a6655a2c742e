"""GQA attention layer with a dataclass config, a fused [q | k | v] kernel of shape
[D, (H + 2 * KV) * HD] split by `jnp.split` at offsets computed from the config, and
`jax.nn.dot_product_attention(is_causal=True)` with native grouped heads (8 query heads, 2 kv
heads, no repeat).

- `attn_split_heads`: on {tp: 2}, the kernel is split outside `shard_map` into per-head
  [D, heads, HD] weights sharded over tp (4 query heads and 1 kv head per device);
- `attn_replicated_kv`: on {tp: 4}, two query heads per device sliced from the fused kernel with
  `lax.dynamic_slice_in_dim`; the two kv heads are replicated and each device picks the one its
  query heads belong to.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class AttnConfig:
    d_model: int = 64
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 8

    @property
    def q_size(self):
        return self.n_heads * self.head_dim

    @property
    def kv_size(self):
        return self.n_kv_heads * self.head_dim


CFG = AttnConfig()
B, T = 2, 8


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    qkv_size = CFG.q_size + 2 * CFG.kv_size
    return f(CFG.d_model, qkv_size), f(CFG.q_size, CFG.d_model), f(B, T, CFG.d_model)


def _heads(t, n):
    return t.reshape(t.shape[0], t.shape[1], n, CFG.head_dim)


def attention(w_qkv, w_o, x):
    q, k, v = jnp.split(x @ w_qkv, [CFG.q_size, CFG.q_size + CFG.kv_size], axis=-1)
    out = jax.nn.dot_product_attention(_heads(q, CFG.n_heads), _heads(k, CFG.n_kv_heads),
                                       _heads(v, CFG.n_kv_heads), is_causal=True)
    return out.reshape(B, T, CFG.q_size) @ w_o


# ---- tp over kv groups: split outside shard_map -----------------------------------------------------

def _per_head(w, n):
    return w.reshape(CFG.d_model, n, CFG.head_dim)


def _local_attention(wq, wk, wv, wo, x):
    q = jnp.einsum("btd,dnh->btnh", x, wq)
    k = jnp.einsum("btd,dnh->btnh", x, wk)
    v = jnp.einsum("btd,dnh->btnh", x, wv)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return lax.psum(jnp.einsum("btnh,nhd->btd", out, wo), "tp")


def _sharded(wq, wk, wv, w_o, x, mesh):
    wo = w_o.reshape(CFG.n_heads, CFG.head_dim, CFG.d_model)
    heads = P(None, "tp", None)
    return jax.shard_map(_local_attention, mesh=mesh,
                         in_specs=(heads, heads, heads, P("tp", None, None), P()),
                         out_specs=P(), check_vma=False)(wq, wk, wv, wo, x)


def attn_split_heads(w_qkv, w_o, x, mesh):
    wq, wk, wv = jnp.split(w_qkv, [CFG.q_size, CFG.q_size + CFG.kv_size], axis=-1)
    return _sharded(_per_head(wq, CFG.n_heads), _per_head(wk, CFG.n_kv_heads),
                    _per_head(wv, CFG.n_kv_heads), w_o, x, mesh)


def attn_split_heads_kv_swapped(w_qkv, w_o, x, mesh):
    wq, wv, wk = jnp.split(w_qkv, [CFG.q_size, CFG.q_size + CFG.kv_size], axis=-1)
    return _sharded(_per_head(wq, CFG.n_heads), _per_head(wk, CFG.n_kv_heads),
                    _per_head(wv, CFG.n_kv_heads), w_o, x, mesh)


# ---- tp wider than the kv heads: kv replicated, sliced per device ----------------------------------

def _kv_group(i, q_per_device):
    return (i * q_per_device) // (CFG.n_heads // CFG.n_kv_heads)


def _kv_group_modulo(i, q_per_device):
    return i % CFG.n_kv_heads


def _replicated_kv_local(w_qkv, w_o_rows, x, kv_group):
    tp = lax.axis_size("tp")
    i = lax.axis_index("tp")
    qpd = CFG.n_heads // tp
    hd = CFG.head_dim
    wq = lax.dynamic_slice_in_dim(w_qkv, i * qpd * hd, qpd * hd, axis=1)
    g = kv_group(i, qpd)
    wk = lax.dynamic_slice_in_dim(w_qkv, CFG.q_size + g * hd, hd, axis=1)
    wv = lax.dynamic_slice_in_dim(w_qkv, CFG.q_size + CFG.kv_size + g * hd, hd, axis=1)
    q = _heads(x @ wq, qpd)
    k, v = _heads(x @ wk, 1), _heads(x @ wv, 1)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return lax.psum(out.reshape(B, T, qpd * hd) @ w_o_rows, "tp")


def _replicated(w_qkv, w_o, x, mesh, kv_group):
    local = functools.partial(_replicated_kv_local, kv_group=kv_group)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("tp", None), P()),
                         out_specs=P(), check_vma=False)(w_qkv, w_o, x)


def attn_replicated_kv(w_qkv, w_o, x, mesh):
    return _replicated(w_qkv, w_o, x, mesh, kv_group=_kv_group)


def attn_replicated_kv_modulo_group(w_qkv, w_o, x, mesh):
    return _replicated(w_qkv, w_o, x, mesh, kv_group=_kv_group_modulo)
