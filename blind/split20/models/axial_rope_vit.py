"""2-D axial RoPE for a ViT on an 8 x 4 patch grid (32 tokens, row-major): the first half of every
head's dims is rotated (rotate-half) by the patch's row, the second half by its column;
bidirectional attention.

- `attn_sp_rows`: shard_map on {sp: 4}, tokens split into chunks of two grid rows; cos/sin tables
  for the whole grid are precomputed and the queries' rows sliced at `axis_index * chunk`, the
  all-gathered keys use the whole table;
- `attn_jit_heads`: jit-partitioned on {dp: 2, tp: 2}, batch over dp and heads over tp by sharding
  constraints, the (row, col) grid built with `jnp.meshgrid`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

B, GH, GW, D, H, HD = 2, 8, 4, 32, 4, 8
T = GH * GW
BASE = 100.0


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, 3, H, HD), f(H, HD, D), f(B, T, D)


def _rotate_half(x, pos):
    half = x.shape[-1] // 2
    inv = BASE ** (-jnp.arange(half) / half)
    ang = pos[..., None].astype(jnp.float32) * inv  # [t, half]
    cos = jnp.concatenate([jnp.cos(ang)] * 2, -1)
    sin = jnp.concatenate([jnp.sin(ang)] * 2, -1)
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + jnp.concatenate([-x2, x1], -1) * sin


def axial_rope(x, rows, cols):
    """x [b, t, h, hd]; rows/cols [t]."""
    q = HD // 2
    r = _rotate_half(x[..., :q], rows[:, None])
    c = _rotate_half(x[..., q:], cols[:, None])
    return jnp.concatenate([r, c], -1)


def _attention(w_qkv, w_o, x, rows, cols):
    q, k, v = jnp.einsum("btd,dchk->cbthk", x, w_qkv)
    q, k = axial_rope(q, rows, cols), axial_rope(k, rows, cols)
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) * HD ** -0.5
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, -1), v)
    return jnp.einsum("bqhk,hkd->bqd", o, w_o)


def attn(w_qkv, w_o, x):
    t = jnp.arange(T)
    return _attention(w_qkv, w_o, x, t // GW, t % GW)


# ---- sequence parallel over grid rows, precomputed tables ---------------------------------------

def rope_tables():
    """cos/sin [T, HD] for every token of the grid: [row freqs x2 | col freqs x2]."""
    t = jnp.arange(T)
    quarter = HD // 4
    inv = BASE ** (-jnp.arange(quarter) / quarter)
    ar, ac = (t // GW)[:, None] * inv, (t % GW)[:, None] * inv
    ang = jnp.concatenate([ar, ar, ac, ac], -1)
    return jnp.cos(ang), jnp.sin(ang)


def _rotate_halves(x):
    q, h = HD // 2, HD // 4
    rh = lambda y: jnp.concatenate([-y[..., h:], y[..., :h]], -1)
    return jnp.concatenate([rh(x[..., :q]), rh(x[..., q:])], -1)


def _apply_table(x, cos, sin):
    return x * cos[:, None] + _rotate_halves(x) * sin[:, None]


def _table_start(chunk):
    return lax.axis_index("sp") * chunk


def _table_start_unscaled(chunk):
    return lax.axis_index("sp")


def _sp_local(w_qkv, w_o, x, table_start):
    chunk = x.shape[1]
    cos, sin = rope_tables()
    qkv = jnp.einsum("btd,dchk->cbthk", x, w_qkv)
    start = table_start(chunk)
    q = _apply_table(qkv[0], lax.dynamic_slice_in_dim(cos, start, chunk),
                     lax.dynamic_slice_in_dim(sin, start, chunk))
    k = _apply_table(lax.all_gather(qkv[1], "sp", axis=1, tiled=True), cos, sin)
    v = lax.all_gather(qkv[2], "sp", axis=1, tiled=True)
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) * HD ** -0.5
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, -1), v)
    return jnp.einsum("bqhk,hkd->bqd", o, w_o)


def _run_sp(w_qkv, w_o, x, mesh, table_start):
    local = lambda w, wo, x: _sp_local(w, wo, x, table_start)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(None, "sp")),
                         out_specs=P(None, "sp"), check_vma=False)(w_qkv, w_o, x)


def attn_sp_rows(w_qkv, w_o, x, mesh):
    return _run_sp(w_qkv, w_o, x, mesh, _table_start)


def attn_sp_rows_table_offset_unscaled(w_qkv, w_o, x, mesh):
    return _run_sp(w_qkv, w_o, x, mesh, _table_start_unscaled)


# ---- jit, heads over tp --------------------------------------------------------------------------

def _grid_ij():
    return jnp.meshgrid(jnp.arange(GH), jnp.arange(GW), indexing="ij")


def _grid_xy():
    return jnp.meshgrid(jnp.arange(GH), jnp.arange(GW), indexing="xy")


def _jit_attn(w_qkv, w_o, x, mesh, grid):
    c = lambda a, *spec: lax.with_sharding_constraint(a, NamedSharding(mesh, P(*spec)))
    rows, cols = (g.reshape(-1) for g in grid())
    w_qkv, w_o, x = c(w_qkv, None, None, "tp"), c(w_o, "tp"), c(x, "dp")
    qkv = c(jnp.einsum("btd,dchk->cbthk", x, w_qkv), None, "dp", None, "tp")
    q, k = axial_rope(qkv[0], rows, cols), axial_rope(qkv[1], rows, cols)
    s = c(jnp.einsum("bqhk,bshk->bhqs", q, k) * HD ** -0.5, "dp", "tp")
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, -1), qkv[2])
    return c(jnp.einsum("bqhk,hkd->bqd", o, w_o), "dp")


def attn_jit_heads(w_qkv, w_o, x, mesh):
    return _jit_attn(w_qkv, w_o, x, mesh, _grid_ij)


def attn_jit_heads_grid_transposed(w_qkv, w_o, x, mesh):
    return _jit_attn(w_qkv, w_o, x, mesh, _grid_xy)
