"""Rotary position embeddings on sequence-/head-sharded activations, three conventions."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, HEADS, HDIM = 2, 8, 4, 8
THETA = 10000.0


def qk_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, HEADS, HDIM), f),
            jax.ShapeDtypeStruct((BATCH, SEQ, HEADS, HDIM), f))


# --- GPT-J style: rotate interleaved pairs (x[2i], x[2i+1]) -------------------------------------
def rope_pairs(x, pos):
    freqs = THETA ** (-jnp.arange(0, HDIM, 2, dtype=jnp.float32) / HDIM)
    ang = pos[:, None].astype(jnp.float32) * freqs
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(x.shape)


def scores_pairs(q, k):
    pos = jnp.arange(SEQ)
    return jnp.einsum("bqhd,bkhd->bhqk", rope_pairs(q, pos), rope_pairs(k, pos))


def scores_pairs_sp(q, k, mesh):
    def local(q, k):
        n = q.shape[1]
        pos = n * lax.axis_index("sp") + jnp.arange(n)
        qr, kr = rope_pairs(q, pos), rope_pairs(k, pos)
        kr = lax.all_gather(kr, "sp", axis=1, tiled=True)
        return jnp.einsum("bqhd,bkhd->bhqk", qr, kr)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, "sp"), P(None, "sp")),
                         out_specs=P(None, None, "sp"))(q, k)


# --- NeoX / Llama style: rotate halves, cos/sin tables precomputed up to MAX_POS ---------------
MAX_POS = 32


def table_inputs():
    f = jnp.float32
    return qk_inputs() + (jax.ShapeDtypeStruct((MAX_POS, HDIM // 2), f),
                          jax.ShapeDtypeStruct((MAX_POS, HDIM // 2), f))


def rotate_half(x):
    a, b = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-b, a], axis=-1)


def apply_table(x, cos, sin):
    cos = jnp.concatenate([cos, cos], -1)[None, :, None, :]
    sin = jnp.concatenate([sin, sin], -1)[None, :, None, :]
    return x * cos + rotate_half(x) * sin


def rotary_tables(q, k, cos_t, sin_t):
    cos, sin = cos_t[:SEQ], sin_t[:SEQ]
    return apply_table(q, cos, sin), apply_table(k, cos, sin)


def rotary_tables_2d(q, k, cos_t, sin_t, mesh):
    """Mesh {sp, tp}: sequence split over sp, heads over tp; tables replicated."""

    def local(q, k, cos_t, sin_t):
        n = q.shape[1]
        cos = lax.dynamic_slice_in_dim(cos_t, lax.axis_index("sp") * n, n, axis=0)
        sin = lax.dynamic_slice_in_dim(sin_t, lax.axis_index("sp") * n, n, axis=0)
        return apply_table(q, cos, sin), apply_table(k, cos, sin)

    spec = P(None, "sp", "tp", None)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, P(), P()),
                         out_specs=(spec, spec))(q, k, cos_t, sin_t)


def rotary_tables_2d_tp_offset(q, k, cos_t, sin_t, mesh):
    def local(q, k, cos_t, sin_t):
        n = q.shape[1]
        cos = lax.dynamic_slice_in_dim(cos_t, lax.axis_index("sp") * n, n, axis=0)
        sin = lax.dynamic_slice_in_dim(sin_t, lax.axis_index("tp") * n, n, axis=0)
        return apply_table(q, cos, sin), apply_table(k, cos, sin)

    spec = P(None, "sp", "tp", None)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, P(), P()),
                         out_specs=(spec, spec))(q, k, cos_t, sin_t)


# --- head-sharded attention block with RoPE written out twice (reference and TP copy) ------------
def rope_attn_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, 16), f), jax.ShapeDtypeStruct((16, HEADS, HDIM), f),
            jax.ShapeDtypeStruct((16, HEADS, HDIM), f), jax.ShapeDtypeStruct((16, HEADS, HDIM), f),
            jax.ShapeDtypeStruct((HEADS, HDIM, 16), f))


def rope_attention(x, wq, wk, wv, wo):
    half = HDIM // 2
    inv = 1.0 / (THETA ** (jnp.arange(half, dtype=jnp.float32) / half))
    ang = jnp.outer(jnp.arange(SEQ, dtype=jnp.float32), inv)
    c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]

    def rot(t):
        t1, t2 = t[..., :half], t[..., half:]
        return jnp.concatenate([t1 * c - t2 * s, t2 * c + t1 * s], axis=-1)

    q = rot(jnp.einsum("bsd,dhk->bshk", x, wq))
    k = rot(jnp.einsum("bsd,dhk->bshk", x, wk))
    v = jnp.einsum("bsd,dhk->bshk", x, wv)
    p = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(HDIM * 1.0), axis=-1)
    return jnp.einsum("bqhk,hkd->bqd", jnp.einsum("bhqs,bshk->bqhk", p, v), wo)


def rope_attention_tp(x, wq, wk, wv, wo, mesh):
    def body(x, wq, wk, wv, wo):
        half = HDIM // 2
        inv = 1.0 / (THETA ** (jnp.arange(half, dtype=jnp.float32) / half))
        ang = jnp.outer(jnp.arange(SEQ, dtype=jnp.float32), inv)
        c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]

        def rot(t):
            t1, t2 = t[..., :half], t[..., half:]
            return jnp.concatenate([t1 * c + t2 * s, t2 * c - t1 * s], axis=-1)

        q = rot(jnp.einsum("bsd,dhk->bshk", x, wq))
        k = rot(jnp.einsum("bsd,dhk->bshk", x, wk))
        v = jnp.einsum("bsd,dhk->bshk", x, wv)
        p = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(HDIM * 1.0), axis=-1)
        out = jnp.einsum("bqhk,hkd->bqd", jnp.einsum("bhqs,bshk->bqhk", p, v), wo)
        return lax.psum(out, "tp")

    w = P(None, "tp", None)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), w, w, w, P("tp", None, None)),
                         out_specs=P())(x, wq, wk, wv, wo)
