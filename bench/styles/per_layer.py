"""Style 2: every layer computes its own rotary tables and causal mask, Hugging Face style.

As in many ports of transformers code: each attention layer builds position ids, the
inverse frequencies, cos/sin of the doubled angles (`rotate_half` convention) and an additive
causal mask (0 / -inf) itself, and softmax runs in float32. Megatron TP with shard_map as in
llama_tp: q/k/v, gate and up column-parallel, output and down projections row-parallel.
The style that took 749 s cold at the 405B shape (issue 16).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from kit import export
from llama_tp import (
    LAYER_SPECS,
    TP,
    Config,
    layer_shapes,
    lm_head,
    model_inputs,
    psum_tp,
    rms_norm,
    swiglu,
)


def rotate_half(x):
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def self_attention(cfg: Config, h, layer, n_heads, n_kv_heads):
    b, s, _ = h.shape
    hd = cfg.head_dim
    position_ids = jnp.arange(s)[None, :]
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    freqs = position_ids[..., None].astype(jnp.float32) * inv_freq  # (1, s, hd / 2)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(emb)[:, :, None, :], jnp.sin(emb)[:, :, None, :]
    causal = jnp.where(position_ids[0][:, None] >= position_ids[0][None, :], 0.0, -jnp.inf)

    q = (h @ layer["wq"]).reshape(b, s, n_heads, hd)
    k = (h @ layer["wk"]).reshape(b, s, n_kv_heads, hd)
    v = (h @ layer["wv"]).reshape(b, s, n_kv_heads, hd)
    q = (q * cos + rotate_half(q) * sin).astype(h.dtype)
    k = (k * cos + rotate_half(k) * sin).astype(h.dtype)
    k = jnp.repeat(k, n_heads // n_kv_heads, axis=2)
    v = jnp.repeat(v, n_heads // n_kv_heads, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * hd**-0.5 + causal
    probs = jax.nn.softmax(scores, axis=-1).astype(h.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, n_heads * hd)
    return out @ layer["wo"]


def decoder_layer(cfg: Config, x, layer, tp=1, reduce=lambda t: t):
    h = rms_norm(x, layer["attn_norm"], cfg.eps)
    x = x + reduce(self_attention(cfg, h, layer, cfg.n_heads // tp, cfg.n_kv_heads // tp))
    h = rms_norm(x, layer["mlp_norm"], cfg.eps)
    return x + reduce(swiglu(h, layer["w_gate"], layer["w_up"], layer["w_down"]))


def reference(cfg: Config, x, params):
    for i, layer in enumerate(params["layers"]):
        with jax.named_scope(f"layers_{i}"):
            x = decoder_layer(cfg, x, layer)
    with jax.named_scope("lm_head"):
        return lm_head(x, params["final_norm"], params["lm_head"], cfg.eps)


def distributed(cfg: Config, x, params, *, mesh):
    tp = mesh.shape[TP]
    specs = {"layers": [LAYER_SPECS] * len(params["layers"]), "final_norm": P(), "lm_head": P(None, TP)}

    def body(x, params):
        for i, layer in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                x = decoder_layer(cfg, x, layer, tp, psum_tp)
        with jax.named_scope("lm_head"):
            return lm_head(x, params["final_norm"], params["lm_head"], cfg.eps)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), specs), out_specs=P(None, None, TP))(x, params)


def inputs(cfg: Config, dtype):
    return model_inputs(cfg, layer_shapes(cfg, dtype), dtype)


export(globals(), reference, distributed, inputs)
