"""Megatron tensor parallelism written two other ways: frozen dataclasses and NamedTuples."""

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

B, S, D, F = 2, 8, 32, 128
H, HD = 8, 4


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class FFN:
    w_in: jax.Array
    b_in: jax.Array
    w_out: jax.Array
    b_out: jax.Array


def _matmul(x, w):
    return lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def ffn(p: FFN, x):
    h = jax.nn.gelu(_matmul(x, p.w_in) + p.b_in, approximate=False)
    return _matmul(h, p.w_out) + p.b_out


def ffn_inputs():
    f32 = jnp.float32
    return (FFN(w_in=jax.ShapeDtypeStruct((D, F), f32), b_in=jax.ShapeDtypeStruct((F,), f32),
                w_out=jax.ShapeDtypeStruct((F, D), f32), b_out=jax.ShapeDtypeStruct((D,), f32)),
            jax.ShapeDtypeStruct((B, S, D), f32))


def ffn_tp(p: FFN, x, mesh):
    def column_then_row(p: FFN, x):
        h = jax.nn.gelu(_matmul(x, p.w_in) + p.b_in, approximate=False)
        return lax.psum(_matmul(h, p.w_out), "model") + p.b_out

    specs = FFN(w_in=P(None, "model"), b_in=P("model"), w_out=P("model", None), b_out=P())
    return shard_map(column_then_row, mesh, in_specs=(specs, P()), out_specs=P(),
                     check_rep=False)(p, x)


class AttnWeights(NamedTuple):
    q: jax.Array   # [D, H, HD]
    k: jax.Array
    v: jax.Array
    o: jax.Array   # [H, HD, D]


def rope_gptj(x, offset=0):
    """Interleaved rotary embedding on x [b, s, h, hd] for positions offset + arange(s)."""
    s, hd = x.shape[1], x.shape[-1]
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, hd, 2) / hd))
    t = jnp.arange(s) + offset
    ang = t[:, None] * freqs[None, :]
    sin = jnp.repeat(jnp.sin(ang), 2, axis=-1)[None, :, None, :]
    cos = jnp.repeat(jnp.cos(ang), 2, axis=-1)[None, :, None, :]
    rot = jnp.stack([-x[..., 1::2], x[..., ::2]], axis=-1).reshape(x.shape)
    return x * cos + rot * sin


def causal_self_attention(w: AttnWeights, x):
    q = rope_gptj(jnp.einsum("bsd,dhe->bshe", x, w.q))
    k = rope_gptj(jnp.einsum("bsd,dhe->bshe", x, w.k))
    v = jnp.einsum("bsd,dhe->bshe", x, w.v)
    s = x.shape[1]
    bias = jnp.where(jnp.arange(s)[:, None] < jnp.arange(s)[None, :], -1e30, 0.0)
    att = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(HD) + bias, axis=-1)
    return jnp.einsum("bhqk,bkhe,hed->bqd", att, v, w.o)


def attention_inputs():
    proj = jax.ShapeDtypeStruct((D, H, HD), jnp.float32)
    return (AttnWeights(proj, proj, proj, jax.ShapeDtypeStruct((H, HD, D), jnp.float32)),
            jax.ShapeDtypeStruct((B, S, D), jnp.float32))


def causal_self_attention_tp(w: AttnWeights, x, mesh):
    specs = AttnWeights(q=P(None, "tp"), k=P(None, "tp"), v=P(None, "tp"), o=P("tp"))

    @jax.shard_map(mesh=mesh, in_specs=(specs, P()), out_specs=P())
    def heads_shard(w, x):
        return lax.psum(causal_self_attention(w, x), "tp")

    return heads_shard(w, x)
