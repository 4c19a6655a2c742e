"""Two RoPE formulations.

Interleaved RoPE (GPT-J pairs (2i, 2i+1)) in causal attention; the reference uses the cos/sin
formula. `rope_rotmat_tp`: shard_map on {tp: 4}, heads over tp, the rotation applied as explicit 2x2
rotation matrices R[t, pair] through one einsum, psum after o-proj.

Half-rotation RoPE (NeoX) with linear position interpolation (positions divided by PI_SCALE,
context extension). `rope_pi_sp`: shard_map on {sp: 4}; query rows over sp with positions offset
by axis_index, keys and values all_gathered.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD = 2, 16, 32, 4, 8
BASE, PI_SCALE = 10000.0, 4.0
S = 4
TL = T // S


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}, f(B, T, D)


def _angles(pos):
    return pos[:, None] * BASE ** (-jnp.arange(0, HD, 2) / HD)


def _rope_pairs(x, pos):
    ang = _angles(pos)[:, None, :]
    c, s = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).reshape(x.shape)


def _attend(q, k, v, wo, qpos, kpos):
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(HD)
    s = jnp.where(qpos[:, None] >= kpos[None, :], s, -1e9)
    return jnp.einsum("bhqs,bshk,hkd->bqd", jax.nn.softmax(s, -1), v, wo)


def _qkv(p, x):
    return [jnp.einsum("btd,dhk->bthk", x, p[n]) for n in ("wq", "wk", "wv")]


def rope_attention(p, x):
    q, k, v = _qkv(p, x)
    pos = jnp.arange(T, dtype=jnp.float32)
    return _attend(_rope_pairs(q, pos), _rope_pairs(k, pos), v, p["wo"], pos, pos)


def _rotmat(pos):
    ang = _angles(pos)
    c, s = jnp.cos(ang), jnp.sin(ang)
    return jnp.stack([jnp.stack([c, -s], -1), jnp.stack([s, c], -1)], -2)


def _rotmat_transposed(pos):
    ang = _angles(pos)
    c, s = jnp.cos(ang), jnp.sin(ang)
    return jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], -2)


def _rotate(r, x):
    b, t, h, _ = x.shape
    return jnp.einsum("tpij,bthpj->bthpi", r, x.reshape(b, t, h, HD // 2, 2)).reshape(x.shape)


def _tp_local(p, x, rotmat):
    q, k, v = _qkv(p, x)
    pos = jnp.arange(T, dtype=jnp.float32)
    r = rotmat(pos)
    return lax.psum(_attend(_rotate(r, q), _rotate(r, k), v, p["wo"], pos, pos), "tp")


def _tp(p, x, mesh, rotmat):
    heads = P(None, "tp", None)
    specs = {"wq": heads, "wk": heads, "wv": heads, "wo": P("tp", None, None)}
    return jax.shard_map(lambda p, x: _tp_local(p, x, rotmat), mesh=mesh, in_specs=(specs, P()), out_specs=P(),
                         check_vma=False)(p, x)


def rope_rotmat_tp(p, x, mesh):
    return _tp(p, x, mesh, _rotmat)


def rope_rotmat_tp_transposed(p, x, mesh):
    return _tp(p, x, mesh, _rotmat_transposed)


def _rope_half(x, pos):
    ang = _angles(pos)[:, None, :]
    c, s = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rope_pi_attention(p, x):
    q, k, v = _qkv(p, x)
    pos = jnp.arange(T, dtype=jnp.float32) / PI_SCALE
    return _attend(_rope_half(q, pos), _rope_half(k, pos), v, p["wo"], pos, pos)


def _sp_local(p, x):
    xk = lax.all_gather(x, "sp", axis=1, tiled=True)
    q = jnp.einsum("btd,dhk->bthk", x, p["wq"])
    k = jnp.einsum("btd,dhk->bthk", xk, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", xk, p["wv"])
    qpos = (lax.axis_index("sp") * TL + jnp.arange(TL)) / PI_SCALE
    kpos = jnp.arange(T) / PI_SCALE
    return _attend(_rope_half(q, qpos), _rope_half(k, kpos), v, p["wo"], qpos, kpos)


def _sp_local_offset_unscaled(p, x):
    xk = lax.all_gather(x, "sp", axis=1, tiled=True)
    q = jnp.einsum("btd,dhk->bthk", x, p["wq"])
    k = jnp.einsum("btd,dhk->bthk", xk, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", xk, p["wv"])
    qpos = lax.axis_index("sp") * TL + jnp.arange(TL) / PI_SCALE
    kpos = jnp.arange(T) / PI_SCALE
    return _attend(_rope_half(q, qpos), _rope_half(k, kpos), v, p["wo"], qpos, kpos)


def _sp(fn, p, x, mesh):
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(None, "sp")), out_specs=P(None, "sp"), check_vma=False)(p, x)


def rope_pi_sp(p, x, mesh):
    return _sp(_sp_local, p, x, mesh)


def rope_pi_sp_offset_unscaled(p, x, mesh):
    return _sp(_sp_local_offset_unscaled, p, x, mesh)
