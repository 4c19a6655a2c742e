"""Style 4: fused QKV and gate/up projections, grouped-query attention without repeating K/V.

One (d_model, n_kv_heads, group + 2, head_dim) weight holds, for each KV head, its `group`
query heads, its key and its value, so splitting it on the KV-head axis gives every device
whole groups (the layout Megatron and NeMo use for GQA). Attention runs on the grouped query
heads (einsum over a group axis) instead of `repeat`-ing K and V. gate and up are one
(d_model, 2, d_ff) weight split on d_ff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from kit import export
from llama_tp import (
    TP,
    Config,
    apply_rope,
    decoder,
    decoder_tp,
    layer_shapes,
    model_inputs,
    rms_norm,
)

FUSED_SPECS = {
    "attn_norm": P(), "mlp_norm": P(),
    "wqkv": P(None, TP, None, None), "wo": P(TP, None),
    "w_gate_up": P(None, None, TP), "w_down": P(TP, None),
}


def grouped_attention(cfg: Config, h, wqkv, wo, cos, sin, tp=1):
    """On the KV heads of one device's share of wqkv (all of them when tp is 1)."""
    b, s, _ = h.shape
    group = cfg.n_heads // cfg.n_kv_heads
    n_heads = cfg.n_heads // tp
    qkv = jnp.einsum("bsd,dkgh->bskgh", h, wqkv)  # (b, s, kv heads, group + 2, head_dim)
    q = qkv[:, :, :, :group]
    q = apply_rope(q.reshape(b, s, n_heads, cfg.head_dim), cos, sin).reshape(q.shape)
    k = apply_rope(qkv[:, :, :, group], cos, sin)
    v = qkv[:, :, :, group + 1]
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / jnp.sqrt(jnp.float32(cfg.head_dim))
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, jnp.float32(-1e30)), axis=-1)
    out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v)
    return out.reshape(b, s, n_heads * cfg.head_dim) @ wo


def fused_block(cfg: Config, x, layer, cos, sin, tp=1, reduce=lambda t: t):
    h = rms_norm(x, layer["attn_norm"], cfg.eps)
    x = x + reduce(grouped_attention(cfg, h, layer["wqkv"], layer["wo"], cos, sin, tp))
    h = rms_norm(x, layer["mlp_norm"], cfg.eps)
    gate_up = jnp.einsum("bsd,dtf->bstf", h, layer["w_gate_up"])
    return x + reduce((jax.nn.silu(gate_up[:, :, 0]) * gate_up[:, :, 1]) @ layer["w_down"])


def reference(cfg: Config, x, params):
    return decoder(cfg, x, params, fused_block)


def distributed(cfg: Config, x, params, *, mesh):
    return decoder_tp(cfg, x, params, mesh, fused_block, FUSED_SPECS)


def inputs(cfg: Config, dtype):
    unfused = layer_shapes(cfg, dtype)
    group = cfg.n_heads // cfg.n_kv_heads
    layer = {
        **{k: unfused[k] for k in ("attn_norm", "mlp_norm", "wo", "w_down")},
        "wqkv": jax.ShapeDtypeStruct((cfg.d_model, cfg.n_kv_heads, group + 2, cfg.head_dim), dtype),
        "w_gate_up": jax.ShapeDtypeStruct((cfg.d_model, 2, cfg.d_ff), dtype),
    }
    return model_inputs(cfg, layer, dtype)


export(globals(), reference, distributed, inputs)
