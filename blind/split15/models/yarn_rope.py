"""YaRN-scaled rotary embedding (half-rotation layout) applied to the query / key projections of a
prompt chunk that starts at integer position `start` (in [0, 64)). YaRN: per-frequency blend of the
original and the interpolated (1/FACTOR) inverse frequencies through a linear ramp over the
rotation count, and cos / sin multiplied by the attention factor `0.1 * ln(FACTOR) + 1`.
Returns (q, k) [B, S, H, HD]. Sequence over `sp`, heads over `tp` on {sp: 2, tp: 2}.

- `rope_tp_sp_table`: a [MAX_POS, HD/2] cos / sin table built once, each device slicing its rows at
  `start + axis_index("sp") * S_LOCAL` with `lax.dynamic_slice_in_dim`; rotation written on halves;
- `rope_tp_sp_complex`: angles computed on the fly from the device's positions, rotation as a
  complex multiplication of (first half + i * second half).
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 32, 4, 16
SP = 2
S_LOCAL = S // SP
MAX_POS = 96
BASE, FACTOR, ORIG_CTX, BETA_FAST, BETA_SLOW = 10000.0, 4.0, 32, 32.0, 1.0
MSCALE = 0.1 * math.log(FACTOR) + 1.0


def rope_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD)}, f(B, S, D), jax.ShapeDtypeStruct((), jnp.int32)


def yarn_inv_freq():
    dims = jnp.arange(0, HD, 2, dtype=jnp.float32)
    extrapolated = 1.0 / BASE ** (dims / HD)
    interpolated = extrapolated / FACTOR

    def correction_dim(rotations):
        return HD * math.log(ORIG_CTX / (rotations * 2 * math.pi)) / (2 * math.log(BASE))

    low = max(math.floor(correction_dim(BETA_FAST)), 0)
    high = min(math.ceil(correction_dim(BETA_SLOW)), HD - 1)
    ramp = jnp.clip((jnp.arange(HD // 2, dtype=jnp.float32) - low) / max(high - low, 1e-3), 0.0, 1.0)
    extrapolation_weight = 1.0 - ramp
    return interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight


def _rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(t, positions):
    angles = positions[:, None].astype(jnp.float32) * yarn_inv_freq()[None, :]
    emb = jnp.concatenate([angles, angles], axis=-1)
    cos, sin = jnp.cos(emb) * MSCALE, jnp.sin(emb) * MSCALE
    return t * cos[None, :, None, :] + _rotate_half(t) * sin[None, :, None, :]


def yarn_qk(params, x, start):
    positions = start + jnp.arange(S)
    q = jnp.einsum("bsd,dhk->bshk", x, params["wq"])
    k = jnp.einsum("bsd,dhk->bshk", x, params["wk"])
    return apply_rope(q, positions), apply_rope(k, positions)


SPECS = {"wq": P(None, "tp"), "wk": P(None, "tp")}
OUT = P(None, "sp", "tp")


def _sharded(local, params, x, start, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P(None, "sp"), P()),
                         out_specs=(OUT, OUT), check_vma=False)(params, x, start)


# ---- sliced cos / sin table ----------------------------------------------------------------------

def _tables():
    angles = jnp.arange(MAX_POS, dtype=jnp.float32)[:, None] * yarn_inv_freq()[None, :]
    return jnp.cos(angles) * MSCALE, jnp.sin(angles) * MSCALE


def _rotate_halves(t, cos, sin):
    t1, t2 = jnp.split(t, 2, axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([t1 * cos - t2 * sin, t2 * cos + t1 * sin], axis=-1)


def _rotate_halves_flipped(t, cos, sin):
    t1, t2 = jnp.split(t, 2, axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([t1 * cos + t2 * sin, t2 * cos - t1 * sin], axis=-1)


def _table_local(params, x, start, rotate):
    cos_t, sin_t = _tables()
    first = start + lax.axis_index("sp") * S_LOCAL
    cos = lax.dynamic_slice_in_dim(cos_t, first, S_LOCAL)
    sin = lax.dynamic_slice_in_dim(sin_t, first, S_LOCAL)
    q = jnp.einsum("bsd,dhk->bshk", x, params["wq"])
    k = jnp.einsum("bsd,dhk->bshk", x, params["wk"])
    return rotate(q, cos, sin), rotate(k, cos, sin)


def rope_tp_sp_table(params, x, start, mesh):
    return _sharded(lambda p, x, s: _table_local(p, x, s, _rotate_halves), params, x, start, mesh)


def rope_tp_sp_table_flipped_sign(params, x, start, mesh):
    return _sharded(lambda p, x, s: _table_local(p, x, s, _rotate_halves_flipped), params, x, start, mesh)


# ---- complex multiplication ------------------------------------------------------------------------

def _complex_local(params, x, start, scale):
    positions = start + lax.axis_index("sp") * S_LOCAL + jnp.arange(S_LOCAL)
    angles = positions[:, None].astype(jnp.float32) * yarn_inv_freq()[None, :]
    rot = lax.complex(jnp.cos(angles), jnp.sin(angles)) * scale

    def rotate(t):
        z = lax.complex(t[..., : HD // 2], t[..., HD // 2:]) * rot[None, :, None, :]
        return jnp.concatenate([jnp.real(z), jnp.imag(z)], axis=-1)

    q = jnp.einsum("bsd,dhk->bshk", x, params["wq"])
    k = jnp.einsum("bsd,dhk->bshk", x, params["wk"])
    return rotate(q), rotate(k)


def rope_tp_sp_complex(params, x, start, mesh):
    return _sharded(lambda p, x, s: _complex_local(p, x, s, MSCALE), params, x, start, mesh)


def rope_tp_sp_complex_no_mscale(params, x, start, mesh):
    return _sharded(lambda p, x, s: _complex_local(p, x, s, 1.0), params, x, start, mesh)
