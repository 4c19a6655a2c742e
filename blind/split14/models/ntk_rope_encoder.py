"""Bidirectional self-attention with HF-style half-rotation RoPE (`rotate_half`, cos/sin tables of
width HD built as `concat([freqs, freqs])`), NTK-aware base scaling (base * alpha^(HD / (HD - 2)))
and explicit integer `position_ids` [B, S] given as an input (e.g. packed or shifted positions).

Sequence parallel on {sp: 4}: hidden states and position ids sharded over the sequence, rotated
keys and values all-gathered over sp.
- `rope_sp_table_gather`: the [MAX_POS, HD] cos / sin tables built once and read at the local
  position ids with `jnp.take(..., axis=0)`;
- `rope_sp_on_the_fly`: angles recomputed from the local ids, halves rotated with `jnp.split` and
  re-joined with `jnp.concatenate`, inside a helper applied to q and k by `jax.tree_util.tree_map`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 32, 4, 8
MAX_POS = 64
BASE, ALPHA = 10000.0, 4.0


def rope_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}
    return params, f(B, S, D), jax.ShapeDtypeStruct((B, S), jnp.int32)


def ntk_inv_freq(base=BASE):
    scaled = base * ALPHA ** (HD / (HD - 2))
    return 1.0 / scaled ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)


def tables():
    freqs = jnp.arange(MAX_POS, dtype=jnp.float32)[:, None] * ntk_inv_freq()[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x):
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return jnp.concatenate([-x2, x1], axis=-1)


def rotate_half_swapped(x):
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return jnp.concatenate([x2, -x1], axis=-1)


def apply_rope(x, cos, sin, rot=rotate_half):
    """x [B, S, H, HD]; cos, sin [B, S, HD]."""
    return x * cos[:, :, None, :] + rot(x) * sin[:, :, None, :]


def _attend(q, k, v, wo):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HD ** -0.5
    return jnp.einsum("bhqk,bkhd,hdo->bqo", jax.nn.softmax(s, axis=-1), v, wo)


def encoder_attention(p, x, position_ids):
    cos, sin = tables()
    cos, sin = cos[position_ids], sin[position_ids]
    q = apply_rope(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), cos, sin)
    k = apply_rope(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), cos, sin)
    v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
    return _attend(q, k, v, p["wo"])


def _run(local, p, x, position_ids, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "sp"), P(None, "sp")),
                         out_specs=P(None, "sp"))(p, x, position_ids)


def _gather_seq(t):
    return lax.all_gather(t, "sp", axis=1, tiled=True)


# ---- tables read at the local ids ---------------------------------------------------------------

def _table_local(rot):
    def local(p, x, ids):
        cos_t, sin_t = tables()
        cos, sin = jnp.take(cos_t, ids, axis=0), jnp.take(sin_t, ids, axis=0)
        q = apply_rope(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), cos, sin, rot)
        k = apply_rope(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), cos, sin, rot)
        v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
        return _attend(q, _gather_seq(k), _gather_seq(v), p["wo"])
    return local


def rope_sp_table_gather(params, x, position_ids, mesh):
    return _run(_table_local(rotate_half), params, x, position_ids, mesh)


def rope_sp_table_gather_swapped_halves(params, x, position_ids, mesh):
    return _run(_table_local(rotate_half_swapped), params, x, position_ids, mesh)


# ---- angles on the fly --------------------------------------------------------------------------

def _rotate_on_the_fly(t, ids, inv_freq):
    ang = ids.astype(jnp.float32)[..., None, None] * inv_freq
    c, s = jnp.cos(ang), jnp.sin(ang)
    t1, t2 = jnp.split(t, 2, axis=-1)
    return jnp.concatenate([t1 * c - t2 * s, t2 * c + t1 * s], axis=-1)


def _fly_local(inv_freq_fn):
    def local(p, x, ids):
        proj = {n: jnp.einsum("bsd,dhk->bshk", x, p[n]) for n in ("wq", "wk", "wv")}
        inv_freq = inv_freq_fn()
        q, k = jax.tree_util.tree_map(lambda t: _rotate_on_the_fly(t, ids, inv_freq),
                                      (proj["wq"], proj["wk"]))
        return _attend(q, _gather_seq(k), _gather_seq(proj["wv"]), p["wo"])
    return local


def rope_sp_on_the_fly(params, x, position_ids, mesh):
    return _run(_fly_local(ntk_inv_freq), params, x, position_ids, mesh)


def rope_sp_on_the_fly_unscaled_base(params, x, position_ids, mesh):
    return _run(_fly_local(lambda: 1.0 / BASE ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)),
                params, x, position_ids, mesh)
