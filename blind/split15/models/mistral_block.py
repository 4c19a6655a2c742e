"""Mistral-style pre-norm decoder, 2 layers (RMSNorm -> causal MHA -> residual, RMSNorm -> SwiGLU ->
residual). Parameters are NamedTuples (`Layer(attn=Attn(...), mlp=Mlp(...), ...)`), heads laid out
as [D, H, HD] kernels. Tensor parallel over `model` and batch over `data` on {data: 2, model: 2}:

- `decoder_tp_dpa`: heads of the local shard computed with `jax.nn.dot_product_attention(is_causal=True)`,
  the per-layer functions built with `functools.partial`;
- `decoder_tp_remat`: each layer under `jax.checkpoint(policy=checkpoint_dots)`, the output
  projection written as an `einsum` over (heads, head_dim).
"""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD, F, N_LAYERS = 4, 8, 32, 4, 8, 48, 2
EPS = 1e-6


class Attn(NamedTuple):
    wq: jax.Array
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array


class Mlp(NamedTuple):
    w_gate: jax.Array
    w_up: jax.Array
    w_down: jax.Array


class Layer(NamedTuple):
    attn_norm: jax.Array
    attn: Attn
    mlp_norm: jax.Array
    mlp: Mlp


def decoder_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    layer = lambda: Layer(f(D), Attn(f(D, H, HD), f(D, H, HD), f(D, H, HD), f(H, HD, D)),
                          f(D), Mlp(f(D, F), f(D, F), f(F, D)))
    return tuple(layer() for _ in range(N_LAYERS)), f(B, S, D)


def rms_norm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def swiglu(m, x):
    return (jax.nn.silu(x @ m.w_gate) * (x @ m.w_up)) @ m.w_down


def causal_attention(a, x):
    q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w) for w in (a.wq, a.wk, a.wv))
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(jnp.float32(HD))
    mask = jnp.tril(jnp.ones((S, S), bool))
    p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
    o = jnp.einsum("bhqs,bshk->bqhk", p, v)
    return jnp.einsum("bqhk,hkd->bqd", o, a.wo)


def decoder(layers, x):
    for lyr in layers:
        x = x + causal_attention(lyr.attn, rms_norm(x, lyr.attn_norm))
        x = x + swiglu(lyr.mlp, rms_norm(x, lyr.mlp_norm))
    return x


LAYER_SPEC = Layer(P(), Attn(P(None, "model"), P(None, "model"), P(None, "model"), P("model")),
                   P(), Mlp(P(None, "model"), P(None, "model"), P("model")))


def _shard(layer_fn, layers, x, mesh):
    def body(layers, x):
        for lyr in layers:
            x = layer_fn(lyr, x)
        return x
    return jax.shard_map(body, mesh=mesh, in_specs=((LAYER_SPEC,) * N_LAYERS, P("data")),
                         out_specs=P("data"), check_vma=False)(layers, x)


# ---- dot_product_attention + functools.partial -------------------------------------------------

def _attn_dpa(a, x):
    q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w) for w in (a.wq, a.wk, a.wv))
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return lax.psum(jnp.einsum("bshk,hkd->bsd", o, a.wo), "model")


def _mlp_tp(m, x, axis):
    return lax.psum(swiglu(m, x), axis)


def _layer_dpa(lyr, x, mlp_fn):
    x = x + _attn_dpa(lyr.attn, rms_norm(x, lyr.attn_norm))
    return x + mlp_fn(lyr.mlp, rms_norm(x, lyr.mlp_norm))


def _layer_dpa_no_residual(lyr, x, mlp_fn):
    x = _attn_dpa(lyr.attn, rms_norm(x, lyr.attn_norm))
    return x + mlp_fn(lyr.mlp, rms_norm(x, lyr.mlp_norm))


def decoder_tp_dpa(layers, x, mesh):
    layer = functools.partial(_layer_dpa, mlp_fn=functools.partial(_mlp_tp, axis="model"))
    return _shard(layer, layers, x, mesh)


def decoder_tp_dpa_no_residual(layers, x, mesh):
    layer = functools.partial(_layer_dpa_no_residual, mlp_fn=functools.partial(_mlp_tp, axis="model"))
    return _shard(layer, layers, x, mesh)


# ---- checkpointed layers ------------------------------------------------------------------------

@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.checkpoint_dots)
def _layer_remat(lyr, x):
    x = x + lax.psum(causal_attention(lyr.attn, rms_norm(x, lyr.attn_norm)), "model")
    return x + lax.psum(swiglu(lyr.mlp, rms_norm(x, lyr.mlp_norm)), "model")


@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.checkpoint_dots)
def _layer_remat_mlp_data(lyr, x):
    x = x + lax.psum(causal_attention(lyr.attn, rms_norm(x, lyr.attn_norm)), "model")
    return x + lax.psum(swiglu(lyr.mlp, rms_norm(x, lyr.mlp_norm)), "data")


def decoder_tp_remat(layers, x, mesh):
    return _shard(_layer_remat, layers, x, mesh)


def decoder_tp_remat_mlp_data(layers, x, mesh):
    return _shard(_layer_remat_mlp_data, layers, x, mesh)
