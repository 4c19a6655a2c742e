"""Qwen2-VL multimodal rotary embedding (M-RoPE): three position streams (temporal, height, width)
of shape [3, B, S]; the rotary frequencies of each head are split into sections [2, 3, 3] and
each section rotates with its own stream (HF `apply_multimodal_rotary_pos_emb`, half-rotation
layout, `mrope_section * 2` over the duplicated [cos | cos] table). Returns the rotated queries and
keys of a projection x @ w_q, x @ w_k.

Mesh {sp: 2, tp: 2}: tokens (and their position ids) over `sp`, heads over `tp`.

- `mrope_on_the_fly`: cos/sin computed per shard from the local position ids;
- `mrope_table`: a [MAX_POS, HD/2] frequency table precomputed once, looked up per stream with
  `jnp.take`, sections selected by slicing the duplicated table.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 32, 4, 16
SECTIONS = (2, 3, 3)
THETA = 10000.0
MAX_POS = 32


def mrope_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, H, HD), f(D, H, HD), f(B, S, D), jax.ShapeDtypeStruct((3, B, S), jnp.int32)


def inv_freq():
    return 1.0 / THETA ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def rotate_half_swapped(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x2, -x1], axis=-1)


def _pick_sections(emb, sections):
    """emb [3, B, S, HD] -> [B, S, HD]: chunk i of the head dim comes from stream i % 3."""
    bounds = [sum(sections[:i + 1]) for i in range(len(sections) - 1)]
    chunks = jnp.split(emb, bounds, axis=-1)
    return jnp.concatenate([c[i % 3] for i, c in enumerate(chunks)], axis=-1)


def _cos_sin(position_ids):
    freqs = position_ids[..., None].astype(jnp.float32) * inv_freq()
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    emb = _pick_sections(emb, SECTIONS * 2)
    return jnp.cos(emb)[:, :, None, :], jnp.sin(emb)[:, :, None, :]


def _apply(x, wq, wk, cos, sin, rot=rotate_half):
    q = jnp.einsum("bsd,dhe->bshe", x, wq)
    k = jnp.einsum("bsd,dhe->bshe", x, wk)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def mrope(wq, wk, x, position_ids):
    cos, sin = _cos_sin(position_ids)
    return _apply(x, wq, wk, cos, sin)


IN_SPECS = (P(None, "tp"), P(None, "tp"), P(None, "sp"), P(None, None, "sp"))
OUT_SPECS = (P(None, "sp", "tp"), P(None, "sp", "tp"))


# ---- on the fly --------------------------------------------------------------------------------------

def _fly_local(wq, wk, x, position_ids, rot):
    cos, sin = _cos_sin(position_ids)
    return _apply(x, wq, wk, cos, sin, rot=rot)


def mrope_on_the_fly(wq, wk, x, position_ids, mesh):
    local = lambda *a: _fly_local(*a, rot=rotate_half)
    return jax.shard_map(local, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(
        wq, wk, x, position_ids)


def mrope_on_the_fly_swapped_half(wq, wk, x, position_ids, mesh):
    local = lambda *a: _fly_local(*a, rot=rotate_half_swapped)
    return jax.shard_map(local, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(
        wq, wk, x, position_ids)


# ---- precomputed table -------------------------------------------------------------------------------

def freq_table():
    return jnp.arange(MAX_POS, dtype=jnp.float32)[:, None] * inv_freq()[None, :]


def _table_local(wq, wk, x, position_ids, table, sections):
    freqs = jnp.take(table, position_ids, axis=0)
    emb = _pick_sections(jnp.concatenate([freqs, freqs], axis=-1), sections)
    cos, sin = jnp.cos(emb)[:, :, None, :], jnp.sin(emb)[:, :, None, :]
    return _apply(x, wq, wk, cos, sin)


def _table(sections, wq, wk, x, position_ids, mesh):
    table = freq_table()
    local = lambda *a: _table_local(*a, table, sections)
    return jax.shard_map(local, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(
        wq, wk, x, position_ids)


def mrope_table(wq, wk, x, position_ids, mesh):
    return _table(SECTIONS * 2, wq, wk, x, position_ids, mesh)


def mrope_table_single_sections(wq, wk, x, position_ids, mesh):
    return _table(SECTIONS, wq, wk, x, position_ids, mesh)
