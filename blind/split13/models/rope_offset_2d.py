"""Causal attention with interleaved (pair-wise) rotary embeddings on a chunk that starts at an
integer offset `start` (chunked prefill): positions are `start + arange(S)`, the cos/sin table
[MAX_POS, HD/2] is built once and sliced at the chunk's positions.

Parallel on a 2-D mesh {sp: 2, tp: 2}: sequence over sp, heads over tp, K/V all-gathered over sp,
the output projection psum-reduced over tp.
- `chunk_attention_2d_table`: the table sliced per device with `lax.dynamic_slice_in_dim` at
  `start + axis_index(sp) * S_LOCAL`; pairs rotated in the [..., HD/2, 2] view;
- `chunk_attention_2d_strided`: angles recomputed on the fly from the device's positions, pairs
  taken with strided slices `x[..., 0::2]`, `x[..., 1::2]` and re-interleaved by stack + reshape.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 8, 32, 4, 8
MAX_POS = 32
THETA = 10000.0
SP, TP = "sp", "tp"
S_LOCAL = S // 2


def chunk_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}
    return params, f(B, S, D), jax.ShapeDtypeStruct((), jnp.int32)


def inv_freq():
    return 1.0 / THETA ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)


def rope_table():
    ang = jnp.arange(MAX_POS, dtype=jnp.float32)[:, None] * inv_freq()[None, :]
    return jnp.cos(ang), jnp.sin(ang)


def rotate_pairs(x, cos, sin):
    """x [B, S, H, HD]; cos, sin [S, HD/2]."""
    xp = x.reshape(*x.shape[:-1], HD // 2, 2)
    c, s = cos[:, None, :], sin[:, None, :]
    out = jnp.stack([xp[..., 0] * c - xp[..., 1] * s, xp[..., 0] * s + xp[..., 1] * c], axis=-1)
    return out.reshape(x.shape)


def _scores_out(q, k, v, q_pos, k_pos, wo):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HD ** -0.5
    s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, -1e30)
    return jnp.einsum("bhqk,bkhd,hdo->bqo", jax.nn.softmax(s, -1), v, wo)


def chunk_attention(p, x, start):
    cos, sin = rope_table()
    cos = lax.dynamic_slice_in_dim(cos, start, S)
    sin = lax.dynamic_slice_in_dim(sin, start, S)
    q = rotate_pairs(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), cos, sin)
    k = rotate_pairs(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), cos, sin)
    v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
    pos = jnp.arange(S)
    return _scores_out(q, k, v, pos, pos, p["wo"])


SPECS = {"wq": P(None, TP), "wk": P(None, TP), "wv": P(None, TP), "wo": P(TP)}


def _run(local, p, x, start, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P(None, SP), P()),
                         out_specs=P(None, SP))(p, x, start)


def _attend_local(q, k, v, wo):
    q_pos = lax.axis_index(SP) * S_LOCAL + jnp.arange(S_LOCAL)
    k = lax.all_gather(k, SP, axis=1, tiled=True)
    v = lax.all_gather(v, SP, axis=1, tiled=True)
    return lax.psum(_scores_out(q, k, v, q_pos, jnp.arange(S), wo), TP)


# ---- per-device slice of the table --------------------------------------------------------------

def _table_local(offset_axis):
    def local(p, x, start):
        cos, sin = rope_table()
        first = start + lax.axis_index(offset_axis) * S_LOCAL
        cos = lax.dynamic_slice_in_dim(cos, first, S_LOCAL)
        sin = lax.dynamic_slice_in_dim(sin, first, S_LOCAL)
        q = rotate_pairs(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), cos, sin)
        k = rotate_pairs(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), cos, sin)
        return _attend_local(q, k, jnp.einsum("bsd,dhk->bshk", x, p["wv"]), p["wo"])
    return local


def chunk_attention_2d_table(p, x, start, mesh):
    return _run(_table_local(SP), p, x, start, mesh)


def chunk_attention_2d_table_tp_offset(p, x, start, mesh):
    return _run(_table_local(TP), p, x, start, mesh)


# ---- strided pairs, angles on the fly ----------------------------------------------------------

def _rotate_strided(x, ang):
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    return jnp.stack([even * c - odd * s, even * s + odd * c], axis=-1).reshape(x.shape)


def _rotate_strided_swapped(x, ang):
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    return jnp.stack([even * c + odd * s, odd * c - even * s], axis=-1).reshape(x.shape)


def _strided_local(rotate):
    def local(p, x, start):
        pos = start + lax.axis_index(SP) * S_LOCAL + jnp.arange(S_LOCAL)
        ang = pos.astype(jnp.float32)[:, None] * inv_freq()[None, :]
        q = rotate(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), ang)
        k = rotate(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), ang)
        return _attend_local(q, k, jnp.einsum("bsd,dhk->bshk", x, p["wv"]), p["wo"])
    return local


def chunk_attention_2d_strided(p, x, start, mesh):
    return _run(_strided_local(_rotate_strided), p, x, start, mesh)


def chunk_attention_2d_strided_inverse(p, x, start, mesh):
    return _run(_strided_local(_rotate_strided_swapped), p, x, start, mesh)
