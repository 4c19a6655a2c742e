"""Llama-style decoder block (RMSNorm, causal attention with NeoX rotary, SwiGLU, two residuals)
in tensor parallelism: heads and FF columns sharded over 'tp', one psum after each sublayer."""
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class Config:
    batch: int = 2
    seq: int = 8
    dim: int = 16
    heads: int = 4
    ff: int = 32

    @property
    def hd(self):
        return self.dim // self.heads


C = Config()


def rms_norm(x, w, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotary(t):
    """t [B, S, h, hd], NeoX half rotation, positions 0..S-1."""
    half = C.hd // 2
    freq = 1.0 / 10000.0 ** (jnp.arange(half) / half)
    ang = jnp.arange(t.shape[1])[:, None] * freq[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    a, b = t[..., :half], t[..., half:]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def _attn(h, wq, wk, wv, n_heads):
    split = lambda t: t.reshape(C.batch, C.seq, n_heads, C.hd)
    q, k, v = rotary(split(h @ wq)), rotary(split(h @ wk)), split(h @ wv)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(C.hd))
    s = jnp.where(jnp.tril(jnp.ones((C.seq, C.seq), bool)), s, -1e9)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)
    return o.reshape(C.batch, C.seq, n_heads * C.hd)


def block(p, x):
    h = x + _attn(rms_norm(x, p["attn_norm"]), p["wq"], p["wk"], p["wv"], C.heads) @ p["wo"]
    z = rms_norm(h, p["mlp_norm"])
    return h + (jax.nn.silu(z @ p["w_gate"]) * (z @ p["w_up"])) @ p["w_down"]


_COL, _ROW = P(None, "tp"), P("tp", None)
SPECS = {"attn_norm": P(), "mlp_norm": P(), "wq": _COL, "wk": _COL, "wv": _COL, "wo": _ROW,
         "w_gate": _COL, "w_up": _COL, "w_down": _ROW}


def block_tp(p, x):
    def local(p, x):
        n_local = C.heads // lax.axis_size("tp")
        a = _attn(rms_norm(x, p["attn_norm"]), p["wq"], p["wk"], p["wv"], n_local) @ p["wo"]
        h = x + lax.psum(a, "tp")
        z = rms_norm(h, p["mlp_norm"])
        m = (jax.nn.silu(z @ p["w_gate"]) * (z @ p["w_up"])) @ p["w_down"]
        return h + lax.psum(m, "tp")

    return jax.shard_map(local, in_specs=(SPECS, P()), out_specs=P(), check_vma=False)(p, x)


def block_tp_no_attn_residual(p, x):
    def local(p, x):
        n_local = C.heads // lax.axis_size("tp")
        a = _attn(rms_norm(x, p["attn_norm"]), p["wq"], p["wk"], p["wv"], n_local) @ p["wo"]
        h = lax.psum(a, "tp")
        z = rms_norm(h, p["mlp_norm"])
        m = (jax.nn.silu(z @ p["w_gate"]) * (z @ p["w_up"])) @ p["w_down"]
        return h + lax.psum(m, "tp")

    return jax.shard_map(local, in_specs=(SPECS, P()), out_specs=P(), check_vma=False)(p, x)


def inputs():
    s, f = jax.ShapeDtypeStruct, jnp.float32
    d, ff = C.dim, C.ff
    p = {"attn_norm": s((d,), f), "mlp_norm": s((d,), f), "wq": s((d, d), f), "wk": s((d, d), f),
         "wv": s((d, d), f), "wo": s((d, d), f), "w_gate": s((d, ff), f), "w_up": s((d, ff), f),
         "w_down": s((ff, d), f)}
    return p, s((C.batch, C.seq, d), f)
