"""Two rotary variants in causal attention.

- ChatGLM-style 2-D RoPE: the head dimension is cut in two halves; the first half is rotated
  (rotate-half convention) by `position_ids`, the second half by `block_position_ids` (both int
  inputs). `glm_tp`: shard_map on {tp: 4}, heads over tp, psum after the output projection.
- Phi-3 LongRoPE: inverse frequencies divided by fixed per-frequency extension factors and the
  cos/sin scaled by a magnitude correction. `longrope_sp`: shard_map on {sp: 4}; every rank builds
  the positions of its sequence chunk from `axis_index`, rotates its q/k chunk, and all-gathers
  the rotated keys and the values.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD = 2, 16, 32, 4, 16
EXT = np.linspace(1.0, 6.0, HD // 2).astype(np.float32)
MSCALE = math.sqrt(1.0 + math.log(4.0) / math.log(16.0))


def glm_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = jax.ShapeDtypeStruct((B, T), jnp.int32)
    return f(D, H, HD), f(D, H, HD), f(D, H, HD), f(H, HD, D), f(B, T, D), i, i


def longrope_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, H, HD), f(D, H, HD), f(D, H, HD), f(H, HD, D), f(B, T, D)


def _rotate_half(x, pos, inv_freq, scale=1.0):
    ang = pos[..., None].astype(jnp.float32) * inv_freq                    # [B, T, n]
    cos = (jnp.cos(ang) * scale)[:, :, None, :]
    sin = (jnp.sin(ang) * scale)[:, :, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _glm_rope(x, pos, block_pos):
    half = HD // 2
    inv = 1.0 / (10000.0 ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([_rotate_half(a, pos, inv), _rotate_half(b, block_pos, inv)], -1)


def _causal(q, k, v, qpos, kpos):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HD)
    s = jnp.where(kpos[None, :] <= qpos[:, None], s, -1e30)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)


def _project(x, wq, wk, wv):
    return (jnp.einsum("btd,dhk->bthk", x, wq), jnp.einsum("btd,dhk->bthk", x, wk),
            jnp.einsum("btd,dhk->bthk", x, wv))


def glm(wq, wk, wv, wo, x, pos, block_pos):
    q, k, v = _project(x, wq, wk, wv)
    q, k = _glm_rope(q, pos, block_pos), _glm_rope(k, pos, block_pos)
    t = jnp.arange(T)
    return jnp.einsum("bthk,hkd->btd", _causal(q, k, v, t, t), wo)


def _glm_local(wq, wk, wv, wo, x, pos, block_pos):
    q, k, v = _project(x, wq, wk, wv)
    q, k = _glm_rope(q, pos, block_pos), _glm_rope(k, pos, block_pos)
    t = jnp.arange(T)
    return lax.psum(jnp.einsum("bthk,hkd->btd", _causal(q, k, v, t, t), wo), "tp")


def _glm_local_ids_swapped(wq, wk, wv, wo, x, pos, block_pos):
    q, k, v = _project(x, wq, wk, wv)
    q, k = _glm_rope(q, block_pos, pos), _glm_rope(k, block_pos, pos)
    t = jnp.arange(T)
    return lax.psum(jnp.einsum("bthk,hkd->btd", _causal(q, k, v, t, t), wo), "tp")


def _run_glm(local, args, mesh):
    heads_in = P(None, "tp")
    specs = (heads_in, heads_in, heads_in, P("tp"), P(), P(), P())
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=specs, out_specs=P())(*args)


def glm_tp(wq, wk, wv, wo, x, pos, block_pos, mesh):
    return _run_glm(_glm_local, (wq, wk, wv, wo, x, pos, block_pos), mesh)


def glm_tp_ids_swapped(wq, wk, wv, wo, x, pos, block_pos, mesh):
    return _run_glm(_glm_local_ids_swapped, (wq, wk, wv, wo, x, pos, block_pos), mesh)


# ---- LongRoPE --------------------------------------------------------------------------------

def _long_inv_freq():
    return 1.0 / (jnp.asarray(EXT) * 10000.0 ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD))


def longrope(wq, wk, wv, wo, x):
    q, k, v = _project(x, wq, wk, wv)
    t = jnp.arange(T)
    pos = jnp.broadcast_to(t, (x.shape[0], T))
    q, k = _rotate_half(q, pos, _long_inv_freq(), MSCALE), _rotate_half(k, pos, _long_inv_freq(), MSCALE)
    return jnp.einsum("bthk,hkd->btd", _causal(q, k, v, t, t), wo)


def _chunk_positions(c):
    return lax.axis_index("sp") * c + jnp.arange(c)


def _chunk_positions_global_stride(c):
    return lax.axis_index("sp") * T + jnp.arange(c)


def _longrope_local(wq, wk, wv, wo, x, positions):
    c = x.shape[1]
    q, k, v = _project(x, wq, wk, wv)
    t = positions(c)
    pos = jnp.broadcast_to(t, (x.shape[0], c))
    q, k = _rotate_half(q, pos, _long_inv_freq(), MSCALE), _rotate_half(k, pos, _long_inv_freq(), MSCALE)
    k_all = lax.all_gather(k, "sp", axis=1, tiled=True)
    v_all = lax.all_gather(v, "sp", axis=1, tiled=True)
    return jnp.einsum("bthk,hkd->btd", _causal(q, k_all, v_all, t, jnp.arange(T)), wo)


def _run_long(args, mesh, positions):
    local = lambda *a: _longrope_local(*a, positions)
    seq = P(None, "sp")
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P(), P(), P(), P(), seq), out_specs=seq)(*args)


def longrope_sp(wq, wk, wv, wo, x, mesh):
    return _run_long((wq, wk, wv, wo, x), mesh, _chunk_positions)


def longrope_sp_global_stride(wq, wk, wv, wo, x, mesh):
    return _run_long((wq, wk, wv, wo, x), mesh, _chunk_positions_global_stride)
