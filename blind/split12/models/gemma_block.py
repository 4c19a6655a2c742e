"""Gemma-2-style decoder block: RMSNorm with a (1 + scale) weight, pre- and post-norms around both
sub-layers, attention logits soft-capped with tanh, GeGLU feed-forward with the Gemma
`gating_einsum` [2, F, D] weight layout. Parameters are a nested dict keyed like the Gemma
checkpoints; every projection is a `jnp.einsum`.

Tensor-parallel versions on {model: 4}:
- `block_tp`: heads and FFW hidden units sharded by shard_map in_specs, the attention and FFW
  outputs all-reduced before their post-norms;
- `block_tp_sliced`: parameters enter replicated and every shard cuts its head / hidden-unit window
  with `lax.dynamic_slice_in_dim` at `axis_index * local_size` (one helper used for every weight).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD, F = 2, 8, 32, 8, 8, 64
AXIS = "model"
CAP = 50.0
EPS = 1e-6


def block_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {
        "pre_attention_norm": {"scale": f(D)},
        "attn": {"q_einsum": {"w": f(H, D, HD)}, "kv_einsum": {"w": f(2, H, D, HD)},
                 "attn_vec_einsum": {"w": f(H, HD, D)}},
        "post_attention_norm": {"scale": f(D)},
        "pre_ffw_norm": {"scale": f(D)},
        "mlp": {"gating_einsum": {"w": f(2, F, D)}, "linear": {"w": f(F, D)}},
        "post_ffw_norm": {"scale": f(D)},
    }
    return params, f(B, S, D)


def rms_norm(x, p):
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * lax.rsqrt(var + EPS) * (1.0 + p["scale"])


def _attend(q, k, v):
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HD ** -0.5
    logits = jnp.tanh(logits / CAP) * CAP
    causal = jnp.tril(jnp.ones((S, S), dtype=bool))
    logits = jnp.where(causal, logits, -2.3819763e38)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)


def _attention_partial(p, x):
    q = jnp.einsum("bsd,hdk->bshk", x, p["q_einsum"]["w"])
    k, v = jnp.einsum("bsd,chdk->cbshk", x, p["kv_einsum"]["w"])
    return jnp.einsum("bshk,hkd->bsd", _attend(q, k, v), p["attn_vec_einsum"]["w"])


def _ffw_partial(p, x):
    gate, up = jnp.einsum("bsd,cfd->cbsf", x, p["gating_einsum"]["w"])
    return jnp.einsum("bsf,fd->bsd", jax.nn.gelu(gate, approximate=True) * up, p["linear"]["w"])


def block(params, x):
    h = rms_norm(x, params["pre_attention_norm"])
    x = x + rms_norm(_attention_partial(params["attn"], h), params["post_attention_norm"])
    h = rms_norm(x, params["pre_ffw_norm"])
    return x + rms_norm(_ffw_partial(params["mlp"], h), params["post_ffw_norm"])


# ---- tensor parallel: sharded by in_specs -------------------------------------------------------

_SPECS = {
    "pre_attention_norm": {"scale": P()},
    "attn": {"q_einsum": {"w": P(AXIS)}, "kv_einsum": {"w": P(None, AXIS)},
             "attn_vec_einsum": {"w": P(AXIS)}},
    "post_attention_norm": {"scale": P()},
    "pre_ffw_norm": {"scale": P()},
    "mlp": {"gating_einsum": {"w": P(None, AXIS)}, "linear": {"w": P(AXIS)}},
    "post_ffw_norm": {"scale": P()},
}


def _tp_block(params, x):
    h = rms_norm(x, params["pre_attention_norm"])
    attn = lax.psum(_attention_partial(params["attn"], h), AXIS)
    x = x + rms_norm(attn, params["post_attention_norm"])
    h = rms_norm(x, params["pre_ffw_norm"])
    ffw = lax.psum(_ffw_partial(params["mlp"], h), AXIS)
    return x + rms_norm(ffw, params["post_ffw_norm"])


def _tp_block_norm_first(params, x):
    h = rms_norm(x, params["pre_attention_norm"])
    attn = lax.psum(rms_norm(_attention_partial(params["attn"], h), params["post_attention_norm"]), AXIS)
    x = x + attn
    h = rms_norm(x, params["pre_ffw_norm"])
    ffw = lax.psum(_ffw_partial(params["mlp"], h), AXIS)
    return x + rms_norm(ffw, params["post_ffw_norm"])


def _run_specs(local_block, params, x, mesh):
    fn = jax.shard_map(local_block, mesh=mesh, in_specs=(_SPECS, P()), out_specs=P())
    return fn(params, x)


def block_tp(params, x, mesh):
    return _run_specs(_tp_block, params, x, mesh)


def block_tp_post_norm_partial(params, x, mesh):
    return _run_specs(_tp_block_norm_first, params, x, mesh)


# ---- tensor parallel: replicated parameters, sliced per shard -----------------------------------

def _shard_window(w, axis, n_total):
    n_local = n_total // lax.axis_size(AXIS)
    return lax.dynamic_slice_in_dim(w, lax.axis_index(AXIS) * n_local, n_local, axis=axis)


def _local_params(params):
    attn, mlp = params["attn"], params["mlp"]
    heads = functools.partial(_shard_window, n_total=H)
    hidden = functools.partial(_shard_window, n_total=F)
    return {
        "attn": {"q_einsum": {"w": heads(attn["q_einsum"]["w"], 0)},
                 "kv_einsum": {"w": heads(attn["kv_einsum"]["w"], 1)},
                 "attn_vec_einsum": {"w": heads(attn["attn_vec_einsum"]["w"], 0)}},
        "mlp": {"gating_einsum": {"w": hidden(mlp["gating_einsum"]["w"], 1)},
                "linear": {"w": hidden(mlp["linear"]["w"], 0)}},
    }


def _sliced_block(params, x):
    local = _local_params(params)
    h = rms_norm(x, params["pre_attention_norm"])
    x = x + rms_norm(lax.psum(_attention_partial(local["attn"], h), AXIS), params["post_attention_norm"])
    h = rms_norm(x, params["pre_ffw_norm"])
    return x + rms_norm(lax.psum(_ffw_partial(local["mlp"], h), AXIS), params["post_ffw_norm"])


def _sliced_block_no_ffw_residual(params, x):
    local = _local_params(params)
    h = rms_norm(x, params["pre_attention_norm"])
    x = x + rms_norm(lax.psum(_attention_partial(local["attn"], h), AXIS), params["post_attention_norm"])
    h = rms_norm(x, params["pre_ffw_norm"])
    return rms_norm(lax.psum(_ffw_partial(local["mlp"], h), AXIS), params["post_ffw_norm"])


def _run_replicated(local_block, params, x, mesh):
    fn = jax.shard_map(local_block, mesh=mesh, in_specs=(P(), P()), out_specs=P())
    return fn(params, x)


def block_tp_sliced(params, x, mesh):
    return _run_replicated(_sliced_block, params, x, mesh)


def block_tp_sliced_no_residual(params, x, mesh):
    return _run_replicated(_sliced_block_no_ffw_residual, params, x, mesh)
