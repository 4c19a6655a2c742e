"""A Llama decoder block under Megatron tensor parallelism, with one KV head per shard.

RMSNorm, grouped-query attention with rotary embeddings and a causal mask, SwiGLU. With as many
KV heads as shards (Llama-3-8B: 8 KV heads at TP=8), each shard owns one KV head and the query
heads that share it; wq/wk/wv, gate and up are column-parallel, wo and down row-parallel.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import causal_attention, repeat_kv, rms_norm, rope, spec

B, S, D, HEAD_DIM, F = 1, 8, 32, 8, 64
N_HEADS, N_KV_HEADS = 8, 4
TP = "tp"


def rope_interleaved(x, positions, base=10000.0):
    """Rotary embedding in the interleaved (GPT-J) convention: pairs (x[2i], x[2i+1]); the
    reference's `rope` rotates halves (x[i], x[i + half]), as Llama does."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., ::2], x[..., 1::2]  # BUG: pairs neighbouring elements where the reference rotates halves (a checkpoint converted for the other convention)
    return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)


def _block(x, g_attn, wq, wk, wv, wo, g_mlp, w_gate, w_up, w_down, rotate=rope, reduce=lambda t: t):
    """The block on the heads and hidden units present in the weights (all, or one shard's)."""
    b, s, _ = x.shape
    h = rms_norm(x, g_attn)
    q = (h @ wq).reshape(b, s, -1, HEAD_DIM)
    k = (h @ wk).reshape(b, s, -1, HEAD_DIM)
    v = (h @ wv).reshape(b, s, -1, HEAD_DIM)
    positions = jnp.arange(s)
    q, k = rotate(q, positions), rotate(k, positions)
    rep = N_HEADS // N_KV_HEADS
    o = causal_attention(q, repeat_kv(k, rep), repeat_kv(v, rep))
    x = x + reduce(o.reshape(b, s, -1) @ wo)
    h = rms_norm(x, g_mlp)
    return x + reduce((jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down)


def block(*args):
    return _block(*args)


def inputs():
    q_dim, kv_dim = N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM
    return (spec(B, S, D), spec(D), spec(D, q_dim), spec(D, kv_dim), spec(D, kv_dim), spec(q_dim, D),
            spec(D), spec(D, F), spec(D, F), spec(F, D))


def _sharded(body, mesh, *args):
    col, row = P(None, TP), P(TP, None)
    specs = (P(), P(), col, col, col, row, P(), col, col, row)
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P())(*args)


def block_tp(*args, mesh):
    def body(*local):
        return _block(*local, reduce=lambda t: lax.psum(t, TP))

    return _sharded(body, mesh, *args)


def block_tp_interleaved_rope(*args, mesh):
    def body(*local):
        return _block(*local, rotate=rope_interleaved, reduce=lambda t: lax.psum(t, TP))

    return _sharded(body, mesh, *args)
