"""bf16 compute with f32 accumulation.

Mamba-2 style gated RMSNorm: y = RMSNorm(x * silu(z)) * g with x, z bf16 projections accumulated in
f32, statistics in f32, the normalised activations cast to bf16 for the output projection.
`gated_norm_tp`: shard_map on {tp: 4}; the F hidden columns over tp, the sum of squares psum'd over
tp before the rsqrt, output projection row-parallel with an f32 psum.

bf16 causal attention: q, k, v in bf16, scores accumulated in f32, softmax in f32, probabilities cast
to bf16 for P.V (f32 accumulation). `bf16_attn_dp_tp`: shard_map on {dp: 2, tp: 2}; batch over dp,
heads over tp, f32 psum of the wo partials over tp.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, F, H, HD = 4, 8, 32, 16, 4, 8
BF, F32 = jnp.bfloat16, jnp.float32


def norm_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wx": f(D, F), "wz": f(D, F), "g": f(F), "wo": f(F, D)}, f(B, T, D)


def _mm(a, w):
    return jnp.dot(a.astype(BF), w.astype(BF), preferred_element_type=F32)


def _gated(p, u):
    xh = _mm(u, p["wx"]) / math.sqrt(D)
    zh = _mm(u, p["wz"]) / math.sqrt(D)
    return xh * jax.nn.silu(zh)


def _norm_out(p, gated, sumsq):
    normed = (gated * lax.rsqrt(sumsq / F + 1e-6)).astype(BF) * p["g"].astype(BF)
    return _mm(normed, p["wo"]) / math.sqrt(F)


def gated_norm(p, u):
    gated = _gated(p, u)
    return _norm_out(p, gated, jnp.sum(gated * gated, -1, keepdims=True))


def _gn_local(p, u):
    gated = _gated(p, u)
    return lax.psum(_norm_out(p, gated, lax.psum(jnp.sum(gated * gated, -1, keepdims=True), "tp")), "tp")


def _gn_local_local_stats(p, u):
    gated = _gated(p, u)
    return lax.psum(_norm_out(p, gated, 4 * jnp.sum(gated * gated, -1, keepdims=True)), "tp")


def _gn_run(fn, p, u, mesh):
    specs = {"wx": P(None, "tp"), "wz": P(None, "tp"), "g": P("tp"), "wo": P("tp", None)}
    return jax.shard_map(fn, mesh=mesh, in_specs=(specs, P()), out_specs=P(), check_vma=False)(p, u)


def gated_norm_tp(p, u, mesh):
    return _gn_run(_gn_local, p, u, mesh)


def gated_norm_tp_local_stats(p, u, mesh):
    return _gn_run(_gn_local_local_stats, p, u, mesh)


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}, f(B, T, D)


def _bf16_attn(p, x):
    xb = x.astype(BF)
    q, k, v = (jnp.einsum("btd,dhk->bhtk", xb, p[n].astype(BF), preferred_element_type=F32).astype(BF)
               for n in ("wq", "wk", "wv"))
    s = jnp.einsum("bhqk,bhsk->bhqs", q, k, preferred_element_type=F32) / (math.sqrt(HD) * D)
    t = jnp.arange(x.shape[1])
    probs = jax.nn.softmax(jnp.where(t[:, None] >= t[None, :], s, -1e30), -1).astype(BF)
    o = jnp.einsum("bhqs,bhsk->bhqk", probs, v, preferred_element_type=F32).astype(BF)
    return jnp.einsum("bhqk,hkd->bqd", o, p["wo"].astype(BF), preferred_element_type=F32) / math.sqrt(H * HD * D)


def bf16_attn(p, x):
    return _bf16_attn(p, x)


def _attn_run(fn, p, x, mesh):
    heads = P(None, "tp", None)
    specs = {"wq": heads, "wk": heads, "wv": heads, "wo": P("tp", None, None)}
    return jax.shard_map(fn, mesh=mesh, in_specs=(specs, P("dp")), out_specs=P("dp"), check_vma=False)(p, x)


def bf16_attn_dp_tp(p, x, mesh):
    return _attn_run(lambda p, x: lax.psum(_bf16_attn(p, x), "tp"), p, x, mesh)


def bf16_attn_dp_tp_psum_over_dp(p, x, mesh):
    return _attn_run(lambda p, x: lax.psum(_bf16_attn(p, x), "dp"), p, x, mesh)
