# Llama-style (rotate-half) RoPE from precomputed cos/sin tables indexed by explicit position ids,
# followed by causal attention; heads split over 'tp'.
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, HEADS, HEAD_DIM, MAX_POS = 2, 6, 4, 8, 32
D_MODEL = HEADS * HEAD_DIM


def _tables():
    inv = 1.0 / (10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM))
    ang = np.outer(np.arange(MAX_POS), inv)
    ang = np.concatenate([ang, ang], axis=-1)
    return jnp.asarray(np.cos(ang), jnp.float32), jnp.asarray(np.sin(ang), jnp.float32)


COS, SIN = _tables()


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), f),
            jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),
            jax.ShapeDtypeStruct((D_MODEL, 3 * D_MODEL), f),
            jax.ShapeDtypeStruct((D_MODEL, D_MODEL), f))


def rotate_half(t):
    a, b = jnp.split(t, 2, axis=-1)
    return jnp.concatenate([-b, a], axis=-1)


def apply_rope(t, position_ids):
    cos = jnp.take(COS, position_ids, axis=0)[:, :, None, :]
    sin = jnp.take(SIN, position_ids, axis=0)[:, :, None, :]
    return t * cos + rotate_half(t) * sin


def attention(x, position_ids, w_qkv, w_o):
    q, k, v = jnp.split(x @ w_qkv, 3, axis=-1)
    q, k, v = (t.reshape(BATCH, SEQ, HEADS, HEAD_DIM) for t in (q, k, v))
    q, k = apply_rope(q, position_ids), apply_rope(k, position_ids)
    s = jnp.einsum("bshd,bthd->bhst", q, k) / np.sqrt(HEAD_DIM)
    s = jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), s, -1e9)
    o = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(s, -1), v).reshape(BATCH, SEQ, D_MODEL)
    return o @ w_o


def attention_tp(x, position_ids, w_qkv, w_o, mesh):
    def body(x, position_ids, wq, wk, wv, w_o):
        h = wq.shape[1] // HEAD_DIM
        q, k, v = ((x @ w).reshape(BATCH, SEQ, h, HEAD_DIM) for w in (wq, wk, wv))
        cos = jnp.take(COS, position_ids, axis=0)[:, :, None, :]
        sin = jnp.take(SIN, position_ids, axis=0)[:, :, None, :]
        q1, q2 = q[..., : HEAD_DIM // 2], q[..., HEAD_DIM // 2:]
        k1, k2 = k[..., : HEAD_DIM // 2], k[..., HEAD_DIM // 2:]
        q = q * cos + jnp.concatenate([-q2, q1], -1) * sin
        k = k * cos + jnp.concatenate([-k2, k1], -1) * sin
        s = jnp.einsum("bshd,bthd->bhst", q, k) / np.sqrt(HEAD_DIM)
        s = jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), s, -1e9)
        o = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(s, -1), v).reshape(BATCH, SEQ, -1)
        return lax.psum(o @ w_o, "tp")

    wq, wk, wv = jnp.split(w_qkv, 3, axis=-1)
    col, row = P(None, "tp"), P("tp", None)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), col, col, col, row),
                         out_specs=P())(x, position_ids, wq, wk, wv, w_o)


def attention_tp_rot(x, position_ids, w_qkv, w_o, mesh):
    def body(x, position_ids, wq, wk, wv, w_o):
        h = wq.shape[1] // HEAD_DIM
        q, k, v = ((x @ w).reshape(BATCH, SEQ, h, HEAD_DIM) for w in (wq, wk, wv))
        cos = jnp.take(COS, position_ids, axis=0)[:, :, None, :]
        sin = jnp.take(SIN, position_ids, axis=0)[:, :, None, :]
        q1, q2 = q[..., : HEAD_DIM // 2], q[..., HEAD_DIM // 2:]
        k1, k2 = k[..., : HEAD_DIM // 2], k[..., HEAD_DIM // 2:]
        q = q * cos + jnp.concatenate([-q2, q1], -1) * sin
        k = k * cos + jnp.concatenate([k2, -k1], -1) * sin
        s = jnp.einsum("bshd,bthd->bhst", q, k) / np.sqrt(HEAD_DIM)
        s = jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), s, -1e9)
        o = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(s, -1), v).reshape(BATCH, SEQ, -1)
        return lax.psum(o @ w_o, "tp")

    wq, wk, wv = jnp.split(w_qkv, 3, axis=-1)
    col, row = P(None, "tp"), P("tp", None)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), col, col, col, row),
                         out_specs=P())(x, position_ids, wq, wk, wv, w_o)
