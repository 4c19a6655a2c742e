"""bf16 compute with f32 accumulation: norms in f32, matmuls in bf16 with f32 results,
softmax upcast to f32, all-reduces in f32."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

bf16, f32 = jnp.bfloat16, jnp.float32
TOK, DIM, FF = 8, 16, 64


def mlp_inputs():
    return (jax.ShapeDtypeStruct((TOK, DIM), f32), jax.ShapeDtypeStruct((DIM,), f32),
            jax.ShapeDtypeStruct((DIM, FF), f32), jax.ShapeDtypeStruct((FF, DIM), f32))


def _rms(x, g):
    x32 = x.astype(f32)
    return (x32 * lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * g).astype(bf16)


def mlp_block(x, g, w1, w2):
    h = jnp.dot(_rms(x, g), w1.astype(bf16), preferred_element_type=f32)
    h = jax.nn.gelu(h).astype(bf16)
    return x + jnp.dot(h, w2.astype(bf16), preferred_element_type=f32)


def mlp_block_tp(x, g, w1, w2, mesh):
    def dev(x, g, w1, w2):
        h = jnp.dot(_rms(x, g), w1.astype(bf16), preferred_element_type=f32)
        h = jax.nn.gelu(h).astype(bf16)
        return x + lax.psum(jnp.dot(h, w2.astype(bf16), preferred_element_type=f32), "tp")

    return jax.shard_map(dev, mesh=mesh, in_specs=(P(), P(), P(None, "tp"), P("tp", None)),
                         out_specs=P())(x, g, w1, w2)


NH, HD = 4, 4


def attn_inputs():
    return (jax.ShapeDtypeStruct((2, TOK, DIM), f32), jax.ShapeDtypeStruct((DIM, 3, NH, HD), f32),
            jax.ShapeDtypeStruct((NH, HD, DIM), f32))


def attn_bf16(x, wqkv, wo):
    qkv = jnp.einsum("bsd,dthk->tbshk", x.astype(bf16), wqkv.astype(bf16))
    logits = jnp.einsum("bqhk,bshk->bhqs", qkv[0], qkv[1], preferred_element_type=f32) * HD ** -0.5
    probs = jax.nn.softmax(logits, axis=-1).astype(bf16)
    ctx = jnp.einsum("bhqs,bshk->bqhk", probs, qkv[2])
    return jnp.einsum("bqhk,hkd->bqd", ctx, wo.astype(bf16), preferred_element_type=f32)


def attn_bf16_tp(x, wqkv, wo, mesh):
    def dev(x, wqkv, wo):
        xb = x.astype(bf16)
        q = jnp.einsum("bsd,dhk->bshk", xb, wqkv[:, 0].astype(bf16))
        k = jnp.einsum("bsd,dhk->bshk", xb, wqkv[:, 1].astype(bf16))
        v = jnp.einsum("bsd,dhk->bshk", xb, wqkv[:, 2].astype(bf16))
        logits = jnp.einsum("bqhk,bshk->bhqs", q, k, preferred_element_type=f32) * HD ** -0.5
        probs = jax.nn.softmax(logits, axis=-1).astype(bf16)
        ctx = jnp.einsum("bhqs,bshk->bqhk", probs, v)
        part = jnp.einsum("bqhk,hkd->bqd", ctx, wo.astype(bf16), preferred_element_type=f32)
        return lax.psum(part, "tp")

    return jax.shard_map(dev, mesh=mesh,
                         in_specs=(P(), P(None, None, "tp", None), P("tp", None, None)),
                         out_specs=P())(x, wqkv, wo)


LONG, RD = 512, 8


def rope_inputs():
    return (jax.ShapeDtypeStruct((1, LONG, 2, RD), f32),)


def _rotate(x, ang):
    c, s = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = x[..., : RD // 2], x[..., RD // 2:]
    out = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    return out.astype(bf16)


def inv_freq():
    return 1.0 / (10000.0 ** (jnp.arange(0, RD, 2, dtype=f32) / RD))


def rope_long(x):
    ang = jnp.arange(LONG).astype(f32)[:, None] * inv_freq()[None, :]
    return _rotate(x.astype(bf16).astype(f32), ang)


def rope_long_sp(x, mesh):
    def dev(x):
        n = x.shape[1]
        pos = lax.axis_index("sp") * n + jnp.arange(n)
        ang = pos.astype(bf16)[:, None] * inv_freq().astype(bf16)[None, :]
        return _rotate(x.astype(bf16).astype(f32), ang.astype(f32))

    return jax.shard_map(dev, mesh=mesh, in_specs=P(None, "sp"), out_specs=P(None, "sp"))(x)


def rope_long_sp_f32(x, mesh):
    def dev(x):
        n = x.shape[1]
        pos = lax.axis_index("sp") * n + jnp.arange(n)
        ang = pos.astype(f32)[:, None] * inv_freq()[None, :]
        return _rotate(x.astype(bf16).astype(f32), ang)

    return jax.shard_map(dev, mesh=mesh, in_specs=P(None, "sp"), out_specs=P(None, "sp"))(x)


def step_inputs():
    return ({"w": jax.ShapeDtypeStruct((DIM, DIM), f32), "v": jax.ShapeDtypeStruct((DIM, 1), f32)},
            jax.ShapeDtypeStruct((TOK, DIM), f32), jax.ShapeDtypeStruct((TOK, 1), f32))


LOSS_SCALE = 1024.0
LR = 0.05


def _loss(p, x, y):
    h = jnp.tanh(jnp.dot(x.astype(bf16), p["w"].astype(bf16), preferred_element_type=f32))
    pred = jnp.dot(h.astype(bf16), p["v"].astype(bf16), preferred_element_type=f32)
    return jnp.mean((pred - y) ** 2)


def scaled_step(p, x, y):
    loss, g = jax.value_and_grad(lambda p: _loss(p, x, y) * LOSS_SCALE)(p)
    g = jax.tree.map(lambda t: t / LOSS_SCALE, g)
    return jax.tree.map(lambda a, b: a - LR * b, p, g), loss / LOSS_SCALE


def scaled_step_dp(p, x, y, mesh):
    def dev(p, x, y):
        loss, g = jax.value_and_grad(lambda p: _loss(p, x, y) * LOSS_SCALE)(p)
        g = lax.pmean(g, "dp")
        new = jax.tree.map(lambda a, b: a - LR * b, p, g)
        return new, lax.pmean(loss, "dp") / LOSS_SCALE

    return jax.shard_map(dev, mesh=mesh, in_specs=(P(), P("dp"), P("dp")),
                         out_specs=(P(), P()), check_vma=False)(p, x, y)
