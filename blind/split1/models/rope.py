"""Rotary attention with the sequence split over devices (context parallelism, all-gathered K/V)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 16, 2, 8
MAX_LEN = 64
THETA = 10_000.0


def rotate_half(x, positions):
    """NeoX / Llama layout: the first half of the head dim rotates with the second half."""
    half = x.shape[-1] // 2
    inv_freq = THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * inv_freq
    cos = jnp.cos(angles)[None, :, None, :]
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rotate_interleaved(x, positions):
    """GPT-J layout: pairs (0, 1), (2, 3), ... rotate together."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / THETA ** (jnp.arange(0, x.shape[-1], 2, dtype=jnp.float32) / x.shape[-1])
    angles = jnp.einsum("s,f->sf", positions.astype(jnp.float32), inv_freq)
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    assert out.shape[-2] == half
    return out.reshape(x.shape)


def _attention(params, x, rope):
    pos = jnp.arange(x.shape[1])
    q = rope(jnp.einsum("bsd,dhk->bshk", x, params["wq"]), pos)
    k = rope(jnp.einsum("bsd,dhk->bshk", x, params["wk"]), pos)
    v = jnp.einsum("bsd,dhk->bshk", x, params["wv"])
    scores = jnp.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(HD)
    scores = jnp.where(pos[:, None] >= pos[None, :], scores, -jnp.inf)
    ctx = jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bqhk,hkd->bqd", ctx, params["wo"])


attention_neox = functools.partial(_attention, rope=rotate_half)
attention_gptj = functools.partial(_attention, rope=rotate_interleaved)


def attention_inputs():
    f32 = jnp.float32
    proj = jax.ShapeDtypeStruct((D, H, HD), f32)
    return ({"wq": proj, "wk": proj, "wv": proj, "wo": jax.ShapeDtypeStruct((H, HD, D), f32)},
            jax.ShapeDtypeStruct((B, S, D), f32))


def _attend_cp(p, x, pos, rope):
    """This rank's query chunk at global positions `pos` against all-gathered keys and values."""
    q = rope(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), pos)
    k = rope(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), pos)
    v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
    k = lax.all_gather(k, "sp", axis=1, tiled=True)
    v = lax.all_gather(v, "sp", axis=1, tiled=True)
    key_pos = lax.iota(jnp.int32, k.shape[1])
    scores = jnp.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(HD)
    scores = jnp.where(pos[:, None] >= key_pos[None, :], scores, -jnp.inf)
    ctx = jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bqhk,hkd->bqd", ctx, p["wo"])


def attention_neox_cp(params, x, mesh):
    def body(p, x):
        chunk = x.shape[1]
        pos = lax.axis_index("sp") * chunk + jnp.arange(chunk, dtype=jnp.int32)
        return _attend_cp(p, x, pos, rotate_half)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "sp")),
                         out_specs=P(None, "sp"))(params, x)


def attention_gptj_cp(params, x, mesh):
    def body(p, x):
        pos = lax.iota(jnp.int32, x.shape[1])
        return _attend_cp(p, x, pos, rotate_interleaved)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "sp")),
                         out_specs=P(None, "sp"))(params, x)


# ---------------------------------------------------------------- precomputed cos/sin tables
def _rope_tables(max_len, head_dim):
    inv = 1.0 / THETA ** (np.arange(0, head_dim, 2) / head_dim)
    ang = np.outer(np.arange(max_len), inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


COS, SIN = _rope_tables(MAX_LEN, HD)


def apply_table(x, cos, sin):
    """x [b, s, h, hd]; cos/sin [s, hd/2] rows for x's positions."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def attention_table(params, x):
    s = x.shape[1]
    cos, sin = COS[:s], SIN[:s]
    q = apply_table(jnp.einsum("bsd,dhk->bshk", x, params["wq"]), cos, sin)
    k = apply_table(jnp.einsum("bsd,dhk->bshk", x, params["wk"]), cos, sin)
    v = jnp.einsum("bsd,dhk->bshk", x, params["wv"])
    scores = jnp.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(HD)
    ctx = jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bqhk,hkd->bqd", ctx, params["wo"])


def attention_table_inputs():
    f32 = jnp.float32
    proj = jax.ShapeDtypeStruct((D, 4, HD), f32)
    return ({"wq": proj, "wk": proj, "wv": proj, "wo": jax.ShapeDtypeStruct((4, HD, D), f32)},
            jax.ShapeDtypeStruct((B, S, D), f32))


def _attend_table_tp(p, x, cos, sin):
    q = apply_table(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), cos, sin)
    k = apply_table(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), cos, sin)
    v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
    k = lax.all_gather(k, "sp", axis=1, tiled=True)
    v = lax.all_gather(v, "sp", axis=1, tiled=True)
    scores = jnp.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(HD)
    ctx = jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(scores, axis=-1), v)
    return lax.psum(jnp.einsum("bqhk,hkd->bqd", ctx, p["wo"]), "tp")


_TABLE_SPECS = ({"wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp")},
                P(None, "sp"))


def attention_table_cp_tp(params, x, mesh):
    @jax.shard_map(mesh=mesh, in_specs=_TABLE_SPECS, out_specs=P(None, "sp"))
    def body(p, x):
        s_local = x.shape[1]
        start = lax.axis_index("sp") * s_local
        cos = lax.dynamic_slice_in_dim(jnp.asarray(COS), start, s_local)
        sin = lax.dynamic_slice_in_dim(jnp.asarray(SIN), start, s_local)
        return _attend_table_tp(p, x, cos, sin)

    return body(params, x)


def attention_table_cp_tp_v2(params, x, mesh):
    @jax.shard_map(mesh=mesh, in_specs=_TABLE_SPECS, out_specs=P(None, "sp"))
    def body(p, x):
        s_local = x.shape[1]
        rows = lax.axis_index("tp") * s_local + jnp.arange(s_local)
        return _attend_table_tp(p, x, jnp.asarray(COS)[rows], jnp.asarray(SIN)[rows])

    return body(params, x)
