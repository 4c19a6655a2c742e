"""A Llama-style decoder and its Megatron tensor-parallel version (shard_map), for the benchmarks.

RMSNorm, grouped-query attention with rotary position embeddings (RoPE), a SwiGLU MLP and a
vocab-parallel LM head. The distributed version keeps activations replicated between blocks:
q/k/v, gate and up projections are column-parallel (heads and d_ff split over `tp`), the output
and down projections are row-parallel (local matmul, then psum), and the LM head is split on the
vocabulary (each device computes its slice of the logits; the output is sharded on the vocab axis).

Shapes only: `inputs_8b()`, `inputs_70b()`, `inputs_405b()` return jax.ShapeDtypeStruct pytrees
(weights are never allocated). The layers are a plain Python loop under
`jax.named_scope(f"layers_{i}")`, so the HLO has one block per layer, as in production code that
does not scan. EQUIVCI_BENCH_LAYERS=N overrides the number of layers (for the flatness sweep).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TP = "tp"
DTYPE = jnp.float32
BATCH, SEQ = 1, 64


@dataclasses.dataclass(frozen=True)
class Config:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab: int
    rope_theta: float = 500000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


# Llama 3 / 3.1 shapes.
LLAMA_8B = Config(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, vocab=128256)
LLAMA_70B = Config(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672, vocab=128256)
LLAMA_405B = Config(d_model=16384, n_layers=126, n_heads=128, n_kv_heads=8, d_ff=53248, vocab=128256)


def n_layers(cfg: Config) -> int:
    return int(os.environ.get("EQUIVCI_BENCH_LAYERS", cfg.n_layers))


# --- shared pieces (used by both programs, as model code shares them) -------------------------------


def rms_norm(x, w, eps):
    x32 = x.astype(jnp.float32)
    scale = lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * scale).astype(x.dtype) * w


def rope_tables(seq, head_dim, theta):
    inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]  # (seq, head_dim / 2)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """x: (batch, seq, heads, head_dim); rotate the two halves of each head."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def attention(h, wq, wk, wv, wo, cos, sin, n_heads, n_kv_heads, head_dim):
    """GQA on the heads present in the weights (all of them, or one device's share)."""
    b, s, _ = h.shape
    q = (h @ wq).reshape(b, s, n_heads, head_dim)
    k = (h @ wk).reshape(b, s, n_kv_heads, head_dim)
    v = (h @ wv).reshape(b, s, n_kv_heads, head_dim)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    group = n_heads // n_kv_heads
    k = jnp.repeat(k, group, axis=2)
    v = jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(head_dim))
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask[None, None], scores, jnp.float32(-1e30))
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # float32 softmax, back to the activations' type
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, n_heads * head_dim)
    return out @ wo


def swiglu(h, w_gate, w_up, w_down):
    return (jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down


def lm_head(h, w_norm, w_out, eps):
    h = rms_norm(h, w_norm, eps)
    return h @ w_out  # logits (of this device's vocab slice, in the distributed program)


def block(cfg: Config, x, layer, cos, sin, tp=1, reduce=lambda t: t):
    """One pre-norm decoder block on `1/tp` of the heads and of d_ff; `reduce` sums the
    row-parallel partial products (lax.psum in the distributed program)."""
    h = rms_norm(x, layer["attn_norm"], cfg.eps)
    x = x + reduce(attention(h, layer["wq"], layer["wk"], layer["wv"], layer["wo"], cos, sin,
                             cfg.n_heads // tp, cfg.n_kv_heads // tp, cfg.head_dim))
    h = rms_norm(x, layer["mlp_norm"], cfg.eps)
    return x + reduce(swiglu(h, layer["w_gate"], layer["w_up"], layer["w_down"]))


# --- the reference: one device ----------------------------------------------------------------------


def decoder(cfg: Config, x, params, layer_fn=block, **parallel):
    """The decoder stack; `layer_fn` is one block (`block`, or another style's), `parallel` its
    tensor-parallel arguments (tp, reduce, ...) inside the distributed program."""
    cos, sin = rope_tables(x.shape[1], cfg.head_dim, cfg.rope_theta)
    for i, layer in enumerate(params["layers"]):
        with jax.named_scope(f"layers_{i}"):
            x = layer_fn(cfg, x, layer, cos, sin, **parallel)
    with jax.named_scope("lm_head"):
        return lm_head(x, params["final_norm"], params["lm_head"], cfg.eps)


# --- the distributed program: Megatron TP with shard_map ---------------------------------------------


# Megatron: q/k/v, gate and up column-parallel; the output and down projections row-parallel.
LAYER_SPECS = {
    "attn_norm": P(), "mlp_norm": P(),
    "wq": P(None, TP), "wk": P(None, TP), "wv": P(None, TP), "wo": P(TP, None),
    "w_gate": P(None, TP), "w_up": P(None, TP), "w_down": P(TP, None),
}


def psum_tp(t):
    return lax.psum(t, TP)  # row-parallel projections: sum the partial products


def decoder_tp(cfg: Config, x, params, mesh, layer_fn=block, layer_specs=LAYER_SPECS, **parallel):
    """The decoder in one shard_map: every layer's weights split by `layer_specs`, the LM head
    vocab-parallel (each device computes its slice of the logits)."""
    specs = {"layers": [layer_specs] * len(params["layers"]), "final_norm": P(), "lm_head": P(None, TP)}

    def body(x, params):
        return decoder(cfg, x, params, layer_fn, tp=mesh.shape[TP], reduce=psum_tp, **parallel)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), specs), out_specs=P(None, None, TP))(x, params)


def layer_shapes(cfg: Config, dtype=DTYPE) -> dict:
    d, hd = cfg.d_model, cfg.head_dim

    def s(*shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    return {
        "attn_norm": s(d), "mlp_norm": s(d),
        "wq": s(d, cfg.n_heads * hd), "wk": s(d, cfg.n_kv_heads * hd), "wv": s(d, cfg.n_kv_heads * hd),
        "wo": s(cfg.n_heads * hd, d),
        "w_gate": s(d, cfg.d_ff), "w_up": s(d, cfg.d_ff), "w_down": s(cfg.d_ff, d),
    }


def model_inputs(cfg: Config, layer: dict, dtype=DTYPE, batch: int = BATCH) -> tuple:
    """(x, params) with n_layers(cfg) copies of the per-layer shapes `layer`."""
    def s(*shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    d = cfg.d_model
    params = {"layers": [dict(layer) for _ in range(n_layers(cfg))], "final_norm": s(d), "lm_head": s(d, cfg.vocab)}
    return (s(batch, SEQ, d), params)


def _inputs(cfg: Config):
    return model_inputs(cfg, layer_shapes(cfg))


def forward_8b(x, params):
    return decoder(LLAMA_8B, x, params)


def forward_8b_tp(x, params, *, mesh):
    return decoder_tp(LLAMA_8B, x, params, mesh)


def inputs_8b():
    return _inputs(LLAMA_8B)


def forward_70b(x, params):
    return decoder(LLAMA_70B, x, params)


def forward_70b_tp(x, params, *, mesh):
    return decoder_tp(LLAMA_70B, x, params, mesh)


def inputs_70b():
    return _inputs(LLAMA_70B)


def forward_405b(x, params):
    return decoder(LLAMA_405B, x, params)


def forward_405b_tp(x, params, *, mesh):
    return decoder_tp(LLAMA_405B, x, params, mesh)


def inputs_405b():
    return _inputs(LLAMA_405B)
