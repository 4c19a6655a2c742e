"""Gemma-2-like decoder: two layers, the first attends in a sliding window of 4 tokens, the second
globally; attention logits are soft-capped (cap * tanh(s / cap)) before the causal mask; RMSNorm
with (1 + scale); tanh-GELU gated MLP. Parameters are a tuple of per-layer NamedTuples.

- `decoder_tp`: shard_map on {tp: 4}, heads and MLP columns split, psum after o-proj and down-proj;
- `decoder_dp_tp`: shard_map on {dp: 2, tp: 2}, batch over dp as well.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 2, 12, 32, 4, 8, 48
WINDOWS = (4, None)
CAP = 3.0


class Layer(NamedTuple):
    attn_norm: jax.Array
    wq: jax.Array  # [D, H, HD]
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array  # [H, HD, D]
    mlp_norm: jax.Array
    w_gate: jax.Array  # [D, F]
    w_up: jax.Array
    w_down: jax.Array  # [F, D]


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    layer = Layer(f(D), f(D, H, HD), f(D, H, HD), f(D, H, HD), f(H, HD, D), f(D), f(D, F), f(D, F), f(F, D))
    return (layer, layer), f(B, T, D)


def rms_norm(x, scale):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * (1.0 + scale)


def allowed(window):
    q = jnp.arange(T)[:, None]
    k = jnp.arange(T)[None, :]
    ok = k <= q
    if window is not None:
        ok = ok & (q - k < window)
    return ok


def _attention(p, h, window):
    q = jnp.einsum("btd,dnh->bnth", h, p.wq) * HD ** -0.5
    k = jnp.einsum("btd,dnh->bnth", h, p.wk)
    v = jnp.einsum("btd,dnh->bnth", h, p.wv)
    s = jnp.einsum("bnqh,bnkh->bnqk", q, k)
    s = CAP * jnp.tanh(s / CAP)
    s = jnp.where(allowed(window), s, -1e30)
    o = jnp.einsum("bnqk,bnkh->bnqh", jax.nn.softmax(s, -1), v)
    return jnp.einsum("bnth,nhd->btd", o, p.wo)


def _mlp(p, h):
    return (jax.nn.gelu(h @ p.w_gate, approximate=True) * (h @ p.w_up)) @ p.w_down


def decoder(layers, x):
    for p, window in zip(layers, WINDOWS):
        x = x + _attention(p, rms_norm(x, p.attn_norm), window)
        x = x + _mlp(p, rms_norm(x, p.mlp_norm))
    return x


# ---- tensor parallel -----------------------------------------------------------------------------

LAYER_SPEC = Layer(P(), P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp"), P(), P(None, "tp"),
                   P(None, "tp"), P("tp"))


def _local_attention(p, h, window):
    q = jnp.einsum("btd,dnh->bnth", h, p.wq) * HD ** -0.5
    k = jnp.einsum("btd,dnh->bnth", h, p.wk)
    v = jnp.einsum("btd,dnh->bnth", h, p.wv)
    s = CAP * jnp.tanh(jnp.einsum("bnqh,bnkh->bnqk", q, k) / CAP)
    s = jnp.where(allowed(window), s, -1e30)
    o = jnp.einsum("bnqk,bnkh->bnqh", jax.nn.softmax(s, -1), v)
    return lax.psum(jnp.einsum("bnth,nhd->btd", o, p.wo), "tp")


def _local_attention_cap_after_mask(p, h, window):
    q = jnp.einsum("btd,dnh->bnth", h, p.wq) * HD ** -0.5
    k = jnp.einsum("btd,dnh->bnth", h, p.wk)
    v = jnp.einsum("btd,dnh->bnth", h, p.wv)
    s = jnp.where(allowed(window), jnp.einsum("bnqh,bnkh->bnqk", q, k), -1e30)
    s = CAP * jnp.tanh(s / CAP)
    o = jnp.einsum("bnqk,bnkh->bnqh", jax.nn.softmax(s, -1), v)
    return lax.psum(jnp.einsum("bnth,nhd->btd", o, p.wo), "tp")


def _local_mlp(p, h):
    return lax.psum(_mlp(p, h), "tp")


def _stack(layers, x, attention, windows):
    for p, window in zip(layers, windows):
        x = x + attention(p, rms_norm(x, p.attn_norm), window)
        x = x + _local_mlp(p, rms_norm(x, p.mlp_norm))
    return x


def decoder_tp(layers, x, mesh):
    body = lambda layers, x: _stack(layers, x, _local_attention, WINDOWS)
    return jax.shard_map(body, mesh=mesh, in_specs=((LAYER_SPEC, LAYER_SPEC), P()), out_specs=P(),
                         check_vma=False)(layers, x)


def decoder_tp_all_global(layers, x, mesh):
    body = lambda layers, x: _stack(layers, x, _local_attention, (None, None))
    return jax.shard_map(body, mesh=mesh, in_specs=((LAYER_SPEC, LAYER_SPEC), P()), out_specs=P(),
                         check_vma=False)(layers, x)


def decoder_dp_tp(layers, x, mesh):
    body = lambda layers, x: _stack(layers, x, _local_attention, WINDOWS)
    return jax.shard_map(body, mesh=mesh, in_specs=((LAYER_SPEC, LAYER_SPEC), P("dp")),
                         out_specs=P("dp"), check_vma=False)(layers, x)


def decoder_dp_tp_cap_after_mask(layers, x, mesh):
    body = lambda layers, x: _stack(layers, x, _local_attention_cap_after_mask, WINDOWS)
    return jax.shard_map(body, mesh=mesh, in_specs=((LAYER_SPEC, LAYER_SPEC), P("dp")),
                         out_specs=P("dp"), check_vma=False)(layers, x)
