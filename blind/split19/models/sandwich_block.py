"""Gemma-2-like "sandwich" decoder layers written Haiku-style: parameters live in a nested dict
keyed by module path ("layer_0" / "attn" / "wq"), every sub-layer has a pre-norm AND a post-norm
(RMSNorm) before the residual add, and the MLP is squared-ReLU (Primer).

- `block_tp`: on {tp: 4}, attention heads and MLP columns over tp; the post-norm runs on the
  reduced (psum) sub-layer output, because RMSNorm is not linear;
- `block_dp_tp`: on {data: 2, tp: 2}, the same with the batch over data.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, H, HD, F, B, T, LAYERS = 32, 4, 8, 64, 2, 8, 2


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    layer = {"attn": {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)},
             "mlp": {"w_in": f(D, F), "w_out": f(F, D)},
             "norm": {"pre_attn": f(D), "post_attn": f(D), "pre_mlp": f(D), "post_mlp": f(D)}}
    return {f"layer_{i}": layer for i in range(LAYERS)}, f(B, T, D)


def rms_norm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def attention(p, h):
    q = jnp.einsum("btd,dnh->btnh", h, p["wq"])
    k = jnp.einsum("btd,dnh->btnh", h, p["wk"])
    v = jnp.einsum("btd,dnh->btnh", h, p["wv"])
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / jnp.sqrt(HD).astype(h.dtype)
    causal = jnp.tril(jnp.ones((h.shape[1], h.shape[1]), bool))
    s = jnp.where(causal, s, -1e9)
    o = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-1), v)
    return jnp.einsum("btnh,nhd->btd", o, p["wo"])


def mlp(p, h):
    return jnp.square(jax.nn.relu(h @ p["w_in"])) @ p["w_out"]


def block(params, x):
    for name in sorted(params):
        p = params[name]
        x = x + rms_norm(attention(p["attn"], rms_norm(x, p["norm"]["pre_attn"])), p["norm"]["post_attn"])
        x = x + rms_norm(mlp(p["mlp"], rms_norm(x, p["norm"]["pre_mlp"])), p["norm"]["post_mlp"])
    return x


# ---- tensor parallel ----------------------------------------------------------------------------

def _post_norm_of_reduced(partial, w, axis):
    return rms_norm(lax.psum(partial, axis), w)


def _post_norm_then_reduce(partial, w, axis):
    return lax.psum(rms_norm(partial, w), axis)


def _local_block(params, x, axis, post):
    for name in sorted(params):
        p = params[name]
        a = attention(p["attn"], rms_norm(x, p["norm"]["pre_attn"]))
        x = x + post(a, p["norm"]["post_attn"], axis)
        m = mlp(p["mlp"], rms_norm(x, p["norm"]["pre_mlp"]))
        x = x + post(m, p["norm"]["post_mlp"], axis)
    return x


def _param_specs(params):
    heads = P(None, "tp", None)
    layer = {"attn": {"wq": heads, "wk": heads, "wv": heads, "wo": P("tp", None, None)},
             "mlp": {"w_in": P(None, "tp"), "w_out": P("tp", None)},
             "norm": {k: P() for k in ("pre_attn", "post_attn", "pre_mlp", "post_mlp")}}
    return {name: layer for name in params}


def _run(params, x, mesh, x_spec, axis, post):
    local = functools.partial(_local_block, axis=axis, post=post)
    return jax.shard_map(local, mesh=mesh, in_specs=(_param_specs(params), x_spec),
                         out_specs=x_spec, check_vma=False)(params, x)


def block_tp(params, x, mesh):
    return _run(params, x, mesh, P(), "tp", _post_norm_of_reduced)


def block_tp_norm_before_reduce(params, x, mesh):
    return _run(params, x, mesh, P(), "tp", _post_norm_then_reduce)


def block_dp_tp(params, x, mesh):
    return _run(params, x, mesh, P("data"), "tp", _post_norm_of_reduced)


def block_dp_tp_reduce_over_data(params, x, mesh):
    return _run(params, x, mesh, P("data"), "data", _post_norm_of_reduced)
