"""Mixed-precision blocks: bfloat16 weights and matmuls with float32 accumulation, float32 norms
and softmax, float32 residual stream."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BF16, F32 = jnp.bfloat16, jnp.float32
N, D, F = 8, 32, 64
HEADS, HD = 4, 8


def rms_norm(x, w):
    x32 = x.astype(F32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * w.astype(F32)).astype(BF16)


def _mm(a, b):
    return jnp.matmul(a, b, preferred_element_type=F32)


def swiglu_block(x, norm_w, w_gate, w_up, w_down):
    h = rms_norm(x, norm_w)
    act = (jax.nn.silu(_mm(h, w_gate)) * _mm(h, w_up)).astype(BF16)
    return x + _mm(act, w_down)


def swiglu_inputs():
    return (
        jax.ShapeDtypeStruct((N, D), F32),
        jax.ShapeDtypeStruct((D,), BF16),
        jax.ShapeDtypeStruct((D, F), BF16),
        jax.ShapeDtypeStruct((D, F), BF16),
        jax.ShapeDtypeStruct((F, D), BF16),
    )


_COL, _ROW = P(None, "tp"), P("tp", None)


def swiglu_block_tp(x, norm_w, w_gate, w_up, w_down, mesh):
    def rank(x, nw, wg, wu, wd):
        h = rms_norm(x, nw)
        act = (jax.nn.silu(_mm(h, wg)) * _mm(h, wu)).astype(BF16)
        return x + lax.psum(_mm(act, wd), "tp")

    return jax.shard_map(rank, mesh=mesh, in_specs=(P(), P(), _COL, _COL, _ROW), out_specs=P())(
        x, norm_w, w_gate, w_up, w_down
    )


def attention_bf16(x, wq, wk, wv, wo):
    xb = x.astype(BF16)
    q, k, v = ((xb @ w).reshape(N, HEADS, HD) for w in (wq, wk, wv))
    logits = jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=F32) * HD**-0.5
    probs = jax.nn.softmax(logits, axis=-1).astype(BF16)
    ctx = jnp.einsum("hqk,khd->qhd", probs, v).reshape(N, HEADS * HD)
    return _mm(ctx, wo)


def attention_bf16_inputs():
    w = jax.ShapeDtypeStruct((D, HEADS * HD), BF16)
    return jax.ShapeDtypeStruct((N, D), F32), w, w, w, jax.ShapeDtypeStruct((HEADS * HD, D), BF16)


def attention_bf16_tp(x, wq, wk, wv, wo, mesh):
    local_heads = HEADS // mesh.shape["tp"]

    def rank(x, wq, wk, wv, wo):
        xb = x.astype(BF16)
        q, k, v = ((xb @ w).reshape(N, local_heads, HD) for w in (wq, wk, wv))
        logits = jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=F32) * HD**-0.5
        probs = jax.nn.softmax(logits, axis=-1).astype(BF16)
        ctx = jnp.einsum("hqk,khd->qhd", probs, v).reshape(N, local_heads * HD)
        return lax.psum(_mm(ctx, wo), "tp")

    return jax.shard_map(rank, mesh=mesh, in_specs=(P(), _COL, _COL, _COL, _ROW), out_specs=P())(x, wq, wk, wv, wo)


def attention_bf16_tp_bf16_out(x, wq, wk, wv, wo, mesh):
    local_heads = HEADS // mesh.shape["tp"]

    def rank(x, wq, wk, wv, wo):
        xb = x.astype(BF16)
        q, k, v = ((xb @ w).reshape(N, local_heads, HD) for w in (wq, wk, wv))
        logits = jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=F32) * HD**-0.5
        probs = jax.nn.softmax(logits, axis=-1).astype(BF16)
        ctx = jnp.einsum("hqk,khd->qhd", probs, v).reshape(N, local_heads * HD)
        return lax.psum(ctx @ wo, "tp")

    return jax.shard_map(rank, mesh=mesh, in_specs=(P(), _COL, _COL, _COL, _ROW), out_specs=P())(x, wq, wk, wv, wo)


# ---- long-context RoPE in bf16 ----

LONG_SEQ, ROPE_DIM = 1024, 8


def _angles(positions):
    inv = 1.0 / (10000.0 ** (jnp.arange(0, ROPE_DIM, 2, dtype=F32) / ROPE_DIM))
    return positions[:, None] * inv[None, :]


def _rotate(x, ang):
    cos, sin = jnp.cos(ang).astype(BF16), jnp.sin(ang).astype(BF16)
    x1, x2 = x[:, : ROPE_DIM // 2], x[:, ROPE_DIM // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_long(x):
    return _rotate(x, _angles(jnp.arange(LONG_SEQ, dtype=F32)))


def rope_long_inputs():
    return (jax.ShapeDtypeStruct((LONG_SEQ, ROPE_DIM), BF16),)


def rope_long_cp(x, mesh):
    chunk = LONG_SEQ // mesh.shape["cp"]

    def shard(xs):
        pos = (lax.axis_index("cp") * chunk + jnp.arange(chunk)).astype(F32)
        return _rotate(xs, _angles(pos))

    return jax.shard_map(shard, mesh=mesh, in_specs=P("cp"), out_specs=P("cp"))(x)


def rope_long_cp_bf16_positions(x, mesh):
    chunk = LONG_SEQ // mesh.shape["cp"]

    def shard(xs):
        pos = (lax.axis_index("cp") * chunk + jnp.arange(chunk)).astype(xs.dtype)
        return _rotate(xs, _angles(pos))

    return jax.shard_map(shard, mesh=mesh, in_specs=P("cp"), out_specs=P("cp"))(x)
