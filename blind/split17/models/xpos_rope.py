"""xPos (length-extrapolatable RoPE) on an interleaved (rotate-every-two) layout for a prefill
chunk that starts at an integer position `start`: queries get the rotation times
zeta^(n / SCALE_BASE), keys the rotation divided by it. The layer returns the rotated queries and
keys (what a serving stack writes to its KV cache) and the causal attention output of the chunk.

- `xpos_chunk_sp`: on {sp: 4}: the chunk's rows over sp, angles and scales computed on the fly at
  positions start + axis_index * rows + t, pairs viewed as [..., HD/2, 2], keys and values
  all-gathered for attention;
- `xpos_chunk_table`: on {dp: 2, sp: 2}: one cos/sin/scale table for MAX_POS positions built up
  front and sliced per device with `lax.dynamic_slice_in_dim`, pairs read by strided slices.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 32, 4, 8
THETA, SCALE_BASE, MAX_POS = 10000.0, 512.0, 128


def xpos_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"wq": f(D, H * HD), "wk": f(D, H * HD), "wv": f(D, H * HD)}
    return params, f(B, S, D), jax.ShapeDtypeStruct((), jnp.int32)


def _freqs():
    return THETA ** (-jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)


def _zeta():
    return (jnp.arange(0, HD, 2, dtype=jnp.float32) + 0.4 * HD) / (1.4 * HD)


def _angles_and_scale(pos):
    pos = pos.astype(jnp.float32)
    return pos[:, None] * _freqs()[None, :], _zeta()[None, :] ** (pos[:, None] / SCALE_BASE)


def _rotate_pairs(x, angle, scale):
    # x: [b, s, h, HD] viewed as HD/2 interleaved pairs; angle, scale: [s, HD/2]
    pairs = x.reshape(*x.shape[:-1], HD // 2, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
    out = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.reshape(x.shape) * jnp.repeat(scale, 2, axis=-1)[None, :, None]


def _attend(q, k, v, q_pos, k_pos):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, -1e30)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def _project(p, x):
    split = lambda t: t.reshape(*x.shape[:2], H, HD)
    return split(x @ p["wq"]), split(x @ p["wk"]), split(x @ p["wv"])


def xpos_chunk(p, x, start):
    q, k, v = _project(p, x)
    pos = start + jnp.arange(S)
    angle, scale = _angles_and_scale(pos)
    q, k = _rotate_pairs(q, angle, scale), _rotate_pairs(k, angle, 1.0 / scale)
    return q, k, _attend(q, k, v, pos, pos)


# ---- rows over sp, angles on the fly ---------------------------------------------------------------

def _rotate_pairs_negated(x, angle, scale):
    pairs = x.reshape(*x.shape[:-1], HD // 2, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
    out = jnp.stack([x1 * cos + x2 * sin, x2 * cos - x1 * sin], axis=-1)
    return out.reshape(x.shape) * jnp.repeat(scale, 2, axis=-1)[None, :, None]


def _sp_local(p, x, start, rotate):
    q, k, v = _project(p, x)
    rows = x.shape[1]
    pos = start + lax.axis_index("sp") * rows + jnp.arange(rows)
    angle, scale = _angles_and_scale(pos)
    q, k = rotate(q, angle, scale), rotate(k, angle, 1.0 / scale)
    k_all = lax.all_gather(k, "sp", axis=1, tiled=True)
    v_all = lax.all_gather(v, "sp", axis=1, tiled=True)
    return q, k, _attend(q, k_all, v_all, pos, start + jnp.arange(S))


def _sp(p, x, start, mesh, rotate):
    rows = P(None, "sp")
    return jax.shard_map(lambda p_, x_, s_: _sp_local(p_, x_, s_, rotate), mesh=mesh,
                         in_specs=(P(), rows, P()), out_specs=(rows, rows, rows),
                         check_vma=False)(p, x, start)


def xpos_chunk_sp(p, x, start, mesh):
    return _sp(p, x, start, mesh, _rotate_pairs)


def xpos_chunk_sp_negated_rotation(p, x, start, mesh):
    return _sp(p, x, start, mesh, _rotate_pairs_negated)


# ---- one table, sliced per device -------------------------------------------------------------------

def _table():
    angle, scale = _angles_and_scale(jnp.arange(MAX_POS))
    return jnp.cos(angle), jnp.sin(angle), scale


def _rotate_strided(x, cos, sin, scale):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin, scale = cos[None, :, None], sin[None, :, None], scale[None, :, None]
    return jnp.stack([(x1 * cos - x2 * sin) * scale, (x2 * cos + x1 * sin) * scale],
                     axis=-1).reshape(x.shape)


def _table_local(p, x, start, row_start):
    q, k, v = _project(p, x)
    rows = x.shape[1]
    first = row_start(start, rows)
    cos, sin, scale = (lax.dynamic_slice_in_dim(t, first, rows, axis=0) for t in _table())
    q, k = _rotate_strided(q, cos, sin, scale), _rotate_strided(k, cos, sin, 1.0 / scale)
    k_all = lax.all_gather(k, "sp", axis=1, tiled=True)
    v_all = lax.all_gather(v, "sp", axis=1, tiled=True)
    pos = first + jnp.arange(rows)
    return q, k, _attend(q, k_all, v_all, pos, start + jnp.arange(S))


def _tabled(p, x, start, mesh, row_start):
    rows = P("dp", "sp")
    return jax.shard_map(lambda p_, x_, s_: _table_local(p_, x_, s_, row_start), mesh=mesh,
                         in_specs=(P(), rows, P()), out_specs=(rows, rows, rows),
                         check_vma=False)(p, x, start)


def xpos_chunk_table(p, x, start, mesh):
    return _tabled(p, x, start, mesh,
                   row_start=lambda start, rows: start + lax.axis_index("sp") * rows)


def xpos_chunk_table_no_start(p, x, start, mesh):
    return _tabled(p, x, start, mesh, row_start=lambda start, rows: lax.axis_index("sp") * rows)
