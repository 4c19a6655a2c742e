"""RoPE variants.

Multi-base RoPE: every head rotates with its own base (BASES[h]), half-rotation layout.
`multibase_tp`: shard_map on {tp: 4}; heads over tp and the per-head base vector passed in sharded
the same way, psum after wo.

Roll-based RoPE over given position ids (packed rows): rotate_half(x) written as
jnp.roll(x, HD // 2) * [-1]*HALF + [+1]*HALF. `roll_rope_sp`: shard_map on {sp: 4}; tokens and
their position ids over sp, rotated keys and values all_gathered, causal mask on global indices.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD = 2, 32, 16, 4, 8
HALF = HD // 2
S = 4
TL = T // S


def multibase_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return ({"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}, f(B, T, D),
            f(H))


def _rope_half(x, pos, base):
    inv = 1.0 / (jnp.abs(base)[:, None] * 100.0 + 10.0) ** (jnp.arange(HALF) / HALF)
    ang = pos[None, :, None] * inv[:, None, :]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = x[..., :HALF], x[..., HALF:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _mb_attn(p, x, base):
    s = 1.0 / math.sqrt(D)
    q = jnp.einsum("btd,dhk->bhtk", x, p["wq"]) * s
    k = jnp.einsum("btd,dhk->bhtk", x, p["wk"]) * s
    v = jnp.einsum("btd,dhk->bhtk", x, p["wv"]) * s
    pos = jnp.arange(T, dtype=jnp.float32)
    q, k = _rope_half(q, pos, base), _rope_half(k, pos, base)
    sc = jnp.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(HD)
    sc = jnp.where(pos[:, None] >= pos[None, :], sc, -1e30)
    o = jnp.einsum("bhqs,bhsk->bhqk", jax.nn.softmax(sc, -1), v)
    return jnp.einsum("bhqk,hkd->bqd", o, p["wo"]) / math.sqrt(H * HD)


def multibase(p, x, base):
    return _mb_attn(p, x, base)


def _mb_run(base_spec, p, x, base, mesh):
    heads = P(None, "tp", None)
    specs = {"wq": heads, "wk": heads, "wv": heads, "wo": P("tp", None, None)}
    return jax.shard_map(lambda p, x, b: lax.psum(_mb_attn(p, x, b[:H // S]), "tp"), mesh=mesh,
                         in_specs=(specs, P(), base_spec), out_specs=P(), check_vma=False)(p, x, base)


def multibase_tp(p, x, base, mesh):
    return _mb_run(P("tp"), p, x, base, mesh)


def multibase_tp_bases_replicated(p, x, base, mesh):
    return _mb_run(P(), p, x, base, mesh)


def roll_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return ({"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD)}, f(B, T, D),
            jax.ShapeDtypeStruct((B, T), jnp.int32))


ROLL_SIGN = np.concatenate([-np.ones(HALF), np.ones(HALF)]).astype(np.float32)
INV = (1.0 / 10000.0 ** (np.arange(HALF) / HALF)).astype(np.float32)


def _rope_roll(x, pos, sign):
    ang = pos[:, :, None, None].astype(jnp.float32) * jnp.concatenate([INV, INV])
    return x * jnp.cos(ang) + jnp.roll(x, HALF, axis=-1) * sign * jnp.sin(ang)


def _roll_attend(q, k, v, qi, ki):
    sc = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(HD)
    sc = jnp.where(qi[:, None] >= ki[None, :], sc, -1e30)
    return jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(sc, -1), v).reshape(q.shape[0], -1, H * HD)


def _proj(p, x):
    return tuple(jnp.einsum("btd,dhk->bthk", x, p[n]) / math.sqrt(D) for n in ("wq", "wk", "wv"))


def roll_rope(p, x, pos):
    q, k, v = _proj(p, x)
    t = jnp.arange(T)
    return _roll_attend(_rope_roll(q, pos, ROLL_SIGN), _rope_roll(k, pos, ROLL_SIGN), v, t, t)


def _roll_local(p, x, pos, sign):
    q, k, v = _proj(p, x)
    q, k = _rope_roll(q, pos, sign), _rope_roll(k, pos, sign)
    gather = lambda a: lax.all_gather(a, "sp", axis=1, tiled=True)
    return _roll_attend(q, gather(k), gather(v), lax.axis_index("sp") * TL + jnp.arange(TL), jnp.arange(T))


def _roll_run(sign, p, x, pos, mesh):
    return jax.shard_map(lambda p, x, pos: _roll_local(p, x, pos, sign), mesh=mesh,
                         in_specs=(P(), P(None, "sp"), P(None, "sp")), out_specs=P(None, "sp"),
                         check_vma=False)(p, x, pos)


def roll_rope_sp(p, x, pos, mesh):
    return _roll_run(ROLL_SIGN, p, x, pos, mesh)


def roll_rope_sp_sign_flipped(p, x, pos, mesh):
    return _roll_run(-ROLL_SIGN, p, x, pos, mesh)
