"""MPT / OLMo-1 style decoder block: RMSNorm, causal MHA whose q/k/v are clamped to [-CLIP, CLIP]
(clip_qkv), tanh-GELU MLP, both sublayers residual.

`block_tp`: shard_map on {tp: 4}; heads and MLP hidden columns over tp, clamp per local head, psum
after wo and w2. `block_dp_tp`: same on {dp: 2, tp: 2} with the batch over dp.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 4, 16, 32, 4, 8, 64
CLIP = 1.5


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"g1": f(D), "g2": f(D), "wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD),
            "wo": f(H, HD, D), "w1": f(D, F), "w2": f(F, D)}, f(B, T, D)


def _rms(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


def _attn(p, h, clip_k=True):
    s = 1.0 / math.sqrt(D)
    q = jnp.clip(jnp.einsum("btd,dhk->bhtk", h, p["wq"]) * s, -CLIP, CLIP)
    k = jnp.einsum("btd,dhk->bhtk", h, p["wk"]) * s
    k = jnp.clip(k, -CLIP, CLIP) if clip_k else k
    v = jnp.clip(jnp.einsum("btd,dhk->bhtk", h, p["wv"]) * s, -CLIP, CLIP)
    sc = jnp.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(HD)
    t = jnp.arange(h.shape[1])
    sc = jnp.where(t[:, None] >= t[None, :], sc, -1e30)
    o = jnp.einsum("bhqs,bhsk->bhqk", jax.nn.softmax(sc, -1), v)
    return jnp.einsum("bhqk,hkd->bqd", o, p["wo"]) / math.sqrt(HD)


def _mlp(p, h):
    return jax.nn.gelu(h @ p["w1"] / math.sqrt(D), approximate=True) @ p["w2"] / math.sqrt(F)


def block(p, x):
    x = x + _attn(p, _rms(x, p["g1"]))
    return x + _mlp(p, _rms(x, p["g2"]))


def _local(p, x):
    x = x + lax.psum(_attn(p, _rms(x, p["g1"])), "tp")
    return x + lax.psum(_mlp(p, _rms(x, p["g2"])), "tp")


def _local_k_unclipped(p, x):
    x = x + lax.psum(_attn(p, _rms(x, p["g1"]), clip_k=False), "tp")
    return x + lax.psum(_mlp(p, _rms(x, p["g2"])), "tp")


def _local_residual_in_psum(p, x):
    x = x + lax.psum(_attn(p, _rms(x, p["g1"])), "tp")
    return lax.psum(x + _mlp(p, _rms(x, p["g2"])), "tp")


def _specs():
    heads = P(None, "tp", None)
    return {"g1": P(), "g2": P(), "wq": heads, "wk": heads, "wv": heads, "wo": P("tp", None, None),
            "w1": P(None, "tp"), "w2": P("tp", None)}


def _run(fn, p, x, mesh, batch):
    return jax.shard_map(fn, mesh=mesh, in_specs=(_specs(), P(batch)), out_specs=P(batch),
                         check_vma=False)(p, x)


def block_tp(p, x, mesh):
    return _run(_local, p, x, mesh, None)


def block_tp_k_unclipped(p, x, mesh):
    return _run(_local_k_unclipped, p, x, mesh, None)


def block_dp_tp(p, x, mesh):
    return _run(_local, p, x, mesh, "dp")


def block_dp_tp_residual_in_psum(p, x, mesh):
    return _run(_local_residual_in_psum, p, x, mesh, "dp")
