"""A Llama-style decoder block (RMSNorm, causal MHA with rotate-half RoPE, SwiGLU, residuals),
tensor-parallel over 'tp' in shard_map: heads and FFN columns split, two all-reduces per block."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, DIM, HEADS, FFN = 2, 8, 32, 4, 64
HEAD_DIM = DIM // HEADS


def block_inputs():
    f = jnp.float32
    s = jax.ShapeDtypeStruct
    params = {"attn_norm": s((DIM,), f), "wq": s((DIM, HEADS, HEAD_DIM), f),
              "wk": s((DIM, HEADS, HEAD_DIM), f), "wv": s((DIM, HEADS, HEAD_DIM), f),
              "wo": s((HEADS, HEAD_DIM, DIM), f), "mlp_norm": s((DIM,), f),
              "w_gate": s((DIM, FFN), f), "w_up": s((DIM, FFN), f), "w_down": s((FFN, DIM), f)}
    return params, s((BATCH, SEQ, DIM), f)


def rms(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w


def rope(x):
    half = HEAD_DIM // 2
    freq = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    ang = jnp.arange(SEQ, dtype=jnp.float32)[:, None] * freq[None]
    cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(p, h):
    q = rope(jnp.einsum("bsd,dhk->bshk", h, p["wq"]))
    k = rope(jnp.einsum("bsd,dhk->bshk", h, p["wk"]))
    v = jnp.einsum("bsd,dhk->bshk", h, p["wv"])
    logits = jnp.einsum("bshk,bthk->bhst", q, k) / jnp.sqrt(jnp.float32(HEAD_DIM))
    logits = jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), logits, -1e9)
    ctx = jnp.einsum("bhst,bthk->bshk", jax.nn.softmax(logits, axis=-1), v)
    return jnp.einsum("bshk,hkd->bsd", ctx, p["wo"])


def swiglu(p, h):
    return (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]


def decoder_block(params, x):
    x = x + attention(params, rms(x, params["attn_norm"]))
    return x + swiglu(params, rms(x, params["mlp_norm"]))


_SPECS = {"attn_norm": P(), "wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"),
          "wo": P("tp"), "mlp_norm": P(), "w_gate": P(None, "tp"), "w_up": P(None, "tp"),
          "w_down": P("tp", None)}


def decoder_block_tp(params, x, mesh):
    def local(p, x):
        x = x + lax.psum(attention(p, rms(x, p["attn_norm"])), "tp")
        return x + lax.psum(swiglu(p, rms(x, p["mlp_norm"])), "tp")

    return jax.shard_map(local, mesh=mesh, in_specs=(_SPECS, P()), out_specs=P())(params, x)


def decoder_block_tp_dropped_residual(params, x, mesh):
    def local(p, x):
        h = lax.psum(attention(p, rms(x, p["attn_norm"])), "tp")
        return h + lax.psum(swiglu(p, rms(h, p["mlp_norm"])), "tp")

    return jax.shard_map(local, mesh=mesh, in_specs=(_SPECS, P()), out_specs=P())(params, x)
