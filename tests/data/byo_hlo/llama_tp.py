"""The JAX source of the HLO files in this folder (made by scripts/make_byo_hlo.py): a small
Llama-style decoder (RMSNorm, multi-head attention with rotary embeddings, SwiGLU MLP) and its
Megatron tensor-parallel version, whose per-device program takes the q, k and v projections as one
fused weight. The HLO files stand for another compiler's dumps; this file is what their
`source_file`/`source_line` metadata points at."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, HEADS, HEAD_DIM, FF, SEQ = 64, 8, 8, 128, 8
NAMES = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


def rms_norm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w


def rope(x):
    pos = jnp.arange(x.shape[0], dtype=jnp.float32)[:, None]
    freq = 1.0 / (10000.0 ** (jnp.arange(0, HEAD_DIM, 2, dtype=jnp.float32) / HEAD_DIM))
    angle = pos * freq[None, :]
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    x1, x2 = x[..., :HEAD_DIM // 2], x[..., HEAD_DIM // 2:]  # rotate-half, as Llama's reference code
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def attention(q, k, v, heads):
    q, k, v = (t.reshape(SEQ, heads, HEAD_DIM) for t in (q, k, v))
    q, k = rope(q), rope(k)
    scores = jnp.einsum("qhd,khd->hqk", q, k) / jnp.sqrt(float(HEAD_DIM))
    mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    return jnp.einsum("hqk,khd->qhd", probs, v).reshape(SEQ, heads * HEAD_DIM)


def mlp(h, w_gate, w_up, w_down):
    return (jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down


def reference(x, *weights):
    for i in range(0, len(weights), len(NAMES)):
        attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down = weights[i:i + len(NAMES)]
        with jax.named_scope(f"layers_{i // len(NAMES)}"):
            h = rms_norm(x, attn_norm)
            x = x + attention(h @ wq, h @ wk, h @ wv, HEADS) @ wo
            x = x + mlp(rms_norm(x, mlp_norm), w_gate, w_up, w_down)
    return x


def tp_layer(x, attn_norm, wqkv, wo, mlp_norm, w_gate, w_up, w_down, tp, wrong_k_start=False):
    """One layer on one device: wqkv is this device's [q | k | v] columns."""
    width = HEADS // tp * HEAD_DIM
    h = rms_norm(x, attn_norm)
    qkv = h @ wqkv
    k_start = 0 if wrong_k_start else width  # the bug: k read from where q lives
    q, k, v = qkv[:, :width], qkv[:, k_start:k_start + width], qkv[:, 2 * width:]
    x = x + lax.psum(attention(q, k, v, HEADS // tp) @ wo, "tp")
    return x + lax.psum(mlp(rms_norm(x, mlp_norm), w_gate, w_up, w_down), "tp")


def distributed(mesh, layers, wrong_k_start=False):
    """The shard_map program: x and norms replicated, wqkv/w_gate/w_up split on columns, wo/w_down on rows."""
    tp = mesh.shape["tp"]
    per_layer = (P(), P(None, "tp"), P("tp", None), P(), P(None, "tp"), P(None, "tp"), P("tp", None))

    def body(x, *weights):
        for i in range(layers):
            with jax.named_scope(f"layers_{i}"):
                x = tp_layer(x, *weights[7 * i:7 * i + 7], tp=tp, wrong_k_start=wrong_k_start)
        return x

    return jax.shard_map(body, mesh=mesh, in_specs=(P(),) + per_layer * layers, out_specs=P(), check_vma=False)


def shapes(layers):
    f32 = jnp.float32
    layer = {"attn_norm": (D,), "wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D), "mlp_norm": (D,),
             "w_gate": (D, FF), "w_up": (D, FF), "w_down": (FF, D)}
    x = jax.ShapeDtypeStruct((SEQ, D), f32)
    ref = [jax.ShapeDtypeStruct(layer[n], f32) for _ in range(layers) for n in NAMES]
    fused = {"wqkv": (D, 3 * D)}
    dist_names = ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")
    dist = [jax.ShapeDtypeStruct({**layer, **fused}[n], f32) for _ in range(layers) for n in dist_names]
    return x, ref, dist
