"""Grouped-query attention with a GPT-NeoX-style per-group fused kernel: `w_qkv` is [D, KV, G + 2, HD],
each kv group holding its G query heads, then its key head, then its value head. 8 query heads,
4 kv groups, causal, no biases; tensor parallel over kv groups on {tp: 2}.

- `gqa_tp_split`: the fused kernel sharded by group (P(None, "tp")), the local projection cut by
  `jnp.split(..., [G, G + 1], axis=3)`;
- `gqa_tp_sliced`: the fused kernel passed replicated, each device cutting its own groups with
  `lax.dynamic_slice_in_dim` at `axis_index * KV_LOCAL` (kernel and output projection alike).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, KV, G, HD = 2, 8, 32, 4, 2, 8
TP = 2
KV_LOCAL = KV // TP


def gqa_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w_qkv": f(D, KV, G + 2, HD), "w_o": f(KV, G, HD, D)}, f(B, S, D)


def _grouped_attention(q, k, v):
    # q [B, S, K, G, HD], k/v [B, S, K, HD]
    s = jnp.einsum("bqkgh,bskh->bkgqs", q, k) * HD ** -0.5
    causal = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
    p = jax.nn.softmax(jnp.where(causal, s, -1e30), axis=-1)
    return jnp.einsum("bkgqs,bskh->bqkgh", p, v)


def gqa(params, x):
    qkv = jnp.einsum("bsd,dkjh->bskjh", x, params["w_qkv"])
    q, k, v = qkv[:, :, :, :G], qkv[:, :, :, G], qkv[:, :, :, G + 1]
    o = _grouped_attention(q, k, v)
    return jnp.einsum("bskgh,kghd->bsd", o, params["w_o"])


# ---- fused kernel sharded by group --------------------------------------------------------------

def _local_split(params, x):
    qkv = jnp.einsum("bsd,dkjh->bskjh", x, params["w_qkv"])
    q, k, v = jnp.split(qkv, [G, G + 1], axis=3)
    o = _grouped_attention(q, k[:, :, :, 0], v[:, :, :, 0])
    return lax.psum(jnp.einsum("bskgh,kghd->bsd", o, params["w_o"]), "tp")


def _local_split_kv_swapped(params, x):
    qkv = jnp.einsum("bsd,dkjh->bskjh", x, params["w_qkv"])
    q, v, k = jnp.split(qkv, [G, G + 1], axis=3)
    o = _grouped_attention(q, k[:, :, :, 0], v[:, :, :, 0])
    return lax.psum(jnp.einsum("bskgh,kghd->bsd", o, params["w_o"]), "tp")


def _sharded(local, params, x, mesh):
    specs = {"w_qkv": P(None, "tp"), "w_o": P("tp")}
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, P()), out_specs=P())(params, x)


def gqa_tp_split(params, x, mesh):
    return _sharded(_local_split, params, x, mesh)


def gqa_tp_split_kv_swapped(params, x, mesh):
    return _sharded(_local_split_kv_swapped, params, x, mesh)


# ---- replicated fused kernel, per-device slices -------------------------------------------------

def _local_sliced(params, x):
    start = lax.axis_index("tp") * KV_LOCAL
    w_qkv = lax.dynamic_slice_in_dim(params["w_qkv"], start, KV_LOCAL, axis=1)
    w_o = lax.dynamic_slice_in_dim(params["w_o"], start, KV_LOCAL, axis=0)
    return lax.psum(gqa({"w_qkv": w_qkv, "w_o": w_o}, x), "tp")


def _local_sliced_unscaled_start(params, x):
    w_qkv = lax.dynamic_slice_in_dim(params["w_qkv"], lax.axis_index("tp"), KV_LOCAL, axis=1)
    w_o = lax.dynamic_slice_in_dim(params["w_o"], lax.axis_index("tp") * KV_LOCAL, KV_LOCAL, axis=0)
    return lax.psum(gqa({"w_qkv": w_qkv, "w_o": w_o}, x), "tp")


def gqa_tp_sliced(params, x, mesh):
    return jax.shard_map(_local_sliced, mesh=mesh, in_specs=(P(), P()), out_specs=P())(params, x)


def gqa_tp_sliced_unscaled_start(params, x, mesh):
    return jax.shard_map(_local_sliced_unscaled_start, mesh=mesh, in_specs=(P(), P()),
                         out_specs=P(), check_vma=False)(params, x)
