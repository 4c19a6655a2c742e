"""Llama-3.1 rotary embeddings: the inverse frequencies are rescaled by wavelength (long waves
divided by `factor`, short waves kept, a smooth blend in between), applied as a half rotation
(`rotate_half`) to queries and keys of a chunk that starts at position `start` (an int32 scalar,
e.g. the length of a cached prefix).

- `rope_sp`: on {sp: 4}, the sequence is split and each device computes its angles from
  `start + axis_index * chunk + arange(chunk)` with its own fused rotate;
- `rope_table_dp_sp`: on {dp: 2, sp: 2}, a cos/sin table of MAX_POS rows is precomputed outside
  shard_map and each device slices its rows at `start + axis_index * chunk`.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, H, HD, MAX_POS = 2, 16, 4, 16, 64
THETA, FACTOR, LOW_FF, HIGH_FF, ORIG_CTX = 500000.0, 8.0, 1.0, 4.0, 64


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(B, T, H, HD), f(B, T, H, HD), jax.ShapeDtypeStruct((), jnp.int32)


def llama3_inv_freq():
    inv = 1.0 / THETA ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = ORIG_CTX / LOW_FF, ORIG_CTX / HIGH_FF
    smooth = (ORIG_CTX / wavelen - LOW_FF) / (HIGH_FF - LOW_FF)
    blended = (1 - smooth) * inv / FACTOR + smooth * inv
    out = jnp.where(wavelen > low_wavelen, inv / FACTOR, inv)
    middle = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return jnp.where(middle, blended, out)


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def _apply(x, cos, sin):
    return x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]


def _cos_sin(pos):
    ang = pos.astype(jnp.float32)[:, None] * llama3_inv_freq()[None, :]
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


def rope(q, k, start):
    cos, sin = _cos_sin(start + jnp.arange(T))
    return _apply(q, cos, sin), _apply(k, cos, sin)


# ---- sequence over sp, a fused rotate per device ------------------------------------------------

def _fused_rotate(x, cos, sin):
    half = HD // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :half], sin[None, :, None, :half]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _fused_rotate_sign_flipped(x, cos, sin):
    half = HD // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :half], sin[None, :, None, :half]
    return jnp.concatenate([x1 * c + x2 * s, x2 * c - x1 * s], axis=-1)


def _sp_local(q, k, start, rotate):
    chunk = q.shape[1]
    cos, sin = _cos_sin(start + lax.axis_index("sp") * chunk + jnp.arange(chunk))
    return rotate(q, cos, sin), rotate(k, cos, sin)


def _sp(q, k, start, mesh, rotate):
    spec = P(None, "sp")
    return jax.shard_map(lambda q, k, s: _sp_local(q, k, s, rotate), mesh=mesh,
                         in_specs=(spec, spec, P()), out_specs=(spec, spec),
                         check_vma=False)(q, k, start)


def rope_sp(q, k, start, mesh):
    return _sp(q, k, start, mesh, _fused_rotate)


def rope_sp_sign_flipped(q, k, start, mesh):
    return _sp(q, k, start, mesh, _fused_rotate_sign_flipped)


# ---- precomputed table sliced per device --------------------------------------------------------

def _table_rows(start, chunk):
    return start + lax.axis_index("sp") * chunk


def _table_rows_without_start(start, chunk):
    return lax.axis_index("sp") * chunk


def _table_local(q, k, cos_t, sin_t, start, rows):
    chunk = q.shape[1]
    first = rows(start, chunk)
    cos = lax.dynamic_slice_in_dim(cos_t, first, chunk, axis=0)
    sin = lax.dynamic_slice_in_dim(sin_t, first, chunk, axis=0)
    return _apply(q, cos, sin), _apply(k, cos, sin)


def _table(q, k, start, mesh, rows):
    cos_t, sin_t = _cos_sin(jnp.arange(MAX_POS))
    spec = P("dp", "sp")
    return jax.shard_map(lambda *a: _table_local(*a, rows), mesh=mesh,
                         in_specs=(spec, spec, P(), P(), P()), out_specs=(spec, spec),
                         check_vma=False)(q, k, cos_t, sin_t, start)


def rope_table_dp_sp(q, k, start, mesh):
    return _table(q, k, start, mesh, _table_rows)


def rope_table_dp_sp_without_start(q, k, start, mesh):
    return _table(q, k, start, mesh, _table_rows_without_start)
