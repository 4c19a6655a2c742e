"""Llama-ish decoder block: RMSNorm with (1 + w) gains, causal SDPA attention, SwiGLU MLP."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, DM, NHEAD, HDIM, FF = 2, 8, 16, 4, 4, 32


def rmsnorm(x, w, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + eps) * (1.0 + w)


def _attn(p, h):
    b, t, _ = h.shape
    q = jnp.einsum("btd,dhk->bthk", h, p["wq"])
    k = jnp.einsum("btd,dhk->bthk", h, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", h, p["wv"])
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return jnp.einsum("bthk,hkd->btd", o, p["wo"])


def _mlp(p, h):
    return (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]


def decoder_block(p, x):
    x = x + _attn(p, rmsnorm(x, p["attn_norm"]))
    return x + _mlp(p, rmsnorm(x, p["mlp_norm"]))


def block_inputs():
    f = jnp.float32

    def s(*shape):
        return jax.ShapeDtypeStruct(shape, f)

    p = {"attn_norm": s(DM), "mlp_norm": s(DM), "wq": s(DM, NHEAD, HDIM), "wk": s(DM, NHEAD, HDIM),
         "wv": s(DM, NHEAD, HDIM), "wo": s(NHEAD, HDIM, DM), "w_gate": s(DM, FF), "w_up": s(DM, FF),
         "w_down": s(FF, DM)}
    return p, s(B, T, DM)


SPECS = {"attn_norm": P(), "mlp_norm": P(), "wq": P(None, "tp"), "wk": P(None, "tp"),
         "wv": P(None, "tp"), "wo": P("tp"), "w_gate": P(None, "tp"), "w_up": P(None, "tp"),
         "w_down": P("tp")}


def _block_tp(p, x):
    x = x + lax.psum(_attn(p, rmsnorm(x, p["attn_norm"])), "tp")
    return x + lax.psum(_mlp(p, rmsnorm(x, p["mlp_norm"])), "tp")


def _block_tp_v2(p, x):
    x = lax.psum(_attn(p, rmsnorm(x, p["attn_norm"])), "tp")
    return x + lax.psum(_mlp(p, rmsnorm(x, p["mlp_norm"])), "tp")


def decoder_block_tp(p, x):
    return jax.shard_map(_block_tp, in_specs=(SPECS, P()), out_specs=P())(p, x)


def decoder_block_tp_v2(p, x):
    return jax.shard_map(_block_tp_v2, in_specs=(SPECS, P()), out_specs=P())(p, x)
