"""Building blocks shared by the zoo's reference models and their sharded versions."""

import jax
import jax.numpy as jnp

F32 = jnp.float32


def spec(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def causal_attention(q, k, v):
    """Softmax attention with a causal mask. q: (B, S, H, Dh); k, v: (B, S, H, Dh)."""
    scale = q.shape[-1] ** -0.5
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = q.shape[1]
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask, scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def repeat_kv(k, n_rep):
    """(B, S, Hkv, Dh) -> (B, S, Hkv * n_rep, Dh): each KV head serves n_rep query heads."""
    return jnp.repeat(k, n_rep, axis=2)


def rms_norm(x, gamma, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def layer_norm(x, gamma, beta, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * gamma + beta


def rope(x, positions, base=10000.0):
    """Rotary embedding of x: (B, S, H, Dh) at integer positions (S,), rotate-half convention."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=F32) / half)
    angles = positions.astype(F32)[:, None] * freqs[None, :]  # (S, half)
    cos = jnp.cos(angles)[None, :, None, :]
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
