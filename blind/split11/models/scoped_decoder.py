"""GPT-2-style decoder blocks written haiku-style: modules are plain functions that fetch their
parameters by name from a scope stack set up by `transform`, so the parameter tree is a nested dict
keyed by scope path. LayerNorm with offset, fused QKV with biases, GELU MLP with biases.

The tensor-parallel versions run the same module functions inside shard_map on the local parameter
slices (the attention reads its local head count off the weight shape); the row-parallel outputs
are all-reduced over `shard` and the replicated output biases added once, after the reduction.
"""
import contextlib
import threading

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 4, 8, 32, 4, 8, 64

_FRAMES = threading.local()


def transform(fn):
    def apply(params, *args):
        _FRAMES.stack = [params]
        try:
            return fn(*args)
        finally:
            del _FRAMES.stack
    return apply


@contextlib.contextmanager
def scope(name):
    _FRAMES.stack.append(_FRAMES.stack[-1][name])
    try:
        yield
    finally:
        _FRAMES.stack.pop()


def get_param(name):
    return _FRAMES.stack[-1][name]


# ---- modules ------------------------------------------------------------------------------------

def layer_norm(x, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * get_param("scale") + get_param("offset")


def attention_heads(x):
    """Causal self-attention up to (not including) the output bias."""
    w = get_param("c_attn")                      # [D, 3, heads, HD]
    heads = w.shape[2]
    qkv = jnp.einsum("btd,dshe->sbthe", x, w) + get_param("c_attn_bias")[:, None, None]
    q, k, v = qkv[0], qkv[1], qkv[2]
    scores = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(jnp.float32(HD))
    keep = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    scores = jnp.where(keep, scores, -1e9)
    ctx = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bqhe,hed->bqd", ctx.reshape(x.shape[0], x.shape[1], heads, HD),
                      get_param("c_proj"))


def mlp_hidden(x):
    """GELU MLP up to (not including) the output bias."""
    h = jax.nn.gelu(x @ get_param("c_fc") + get_param("c_fc_bias"))
    return h @ get_param("c_proj")


def block_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    ln = lambda: {"scale": f(D), "offset": f(D)}
    params = {
        "ln_1": ln(),
        "attn": {"c_attn": f(D, 3, H, HD), "c_attn_bias": f(3, H, HD), "c_proj": f(H, HD, D),
                 "c_proj_bias": f(D)},
        "ln_2": ln(),
        "mlp": {"c_fc": f(D, F), "c_fc_bias": f(F), "c_proj": f(F, D), "c_proj_bias": f(D)},
    }
    return params, f(B, T, D)


def parallel_block_inputs():
    params, x = block_inputs()
    del params["ln_2"]
    return params, x


def _param_specs(axis, tree):
    ln = {"scale": P(), "offset": P()}
    specs = {
        "ln_1": ln,
        "attn": {"c_attn": P(None, None, axis), "c_attn_bias": P(None, axis), "c_proj": P(axis),
                 "c_proj_bias": P()},
        "ln_2": ln,
        "mlp": {"c_fc": P(None, axis), "c_fc_bias": P(axis), "c_proj": P(axis), "c_proj_bias": P()},
    }
    return {name: spec for name, spec in specs.items() if name in tree}


# ---- sequential residual block ------------------------------------------------------------------

def _sequential(x):
    with scope("ln_1"):
        h = layer_norm(x)
    with scope("attn"):
        x = x + attention_heads(h) + get_param("c_proj_bias")
    with scope("ln_2"):
        h = layer_norm(x)
    with scope("mlp"):
        x = x + mlp_hidden(h) + get_param("c_proj_bias")
    return x


block = transform(_sequential)


def _sequential_tp(x):
    with scope("ln_1"):
        h = layer_norm(x)
    with scope("attn"):
        x = x + lax.psum(attention_heads(h), "shard") + get_param("c_proj_bias")
    with scope("ln_2"):
        h = layer_norm(x)
    with scope("mlp"):
        x = x + lax.psum(mlp_hidden(h), "shard") + get_param("c_proj_bias")
    return x


def _sequential_tp_bias_in_reduce(x):
    with scope("ln_1"):
        h = layer_norm(x)
    with scope("attn"):
        x = x + lax.psum(attention_heads(h) + get_param("c_proj_bias"), "shard")
    with scope("ln_2"):
        h = layer_norm(x)
    with scope("mlp"):
        x = x + lax.psum(mlp_hidden(h), "shard") + get_param("c_proj_bias")
    return x


def _shard(body, params, mesh):
    return jax.shard_map(transform(body), mesh=mesh,
                         in_specs=(_param_specs("shard", params), P("replica")),
                         out_specs=P("replica"))


def block_tp(params, x, mesh):
    return _shard(_sequential_tp, params, mesh)(params, x)


def block_tp_bias_in_reduce(params, x, mesh):
    return _shard(_sequential_tp_bias_in_reduce, params, mesh)(params, x)


# ---- parallel residual block (attention and MLP read the same normalized input) ----------------

def _parallel(x):
    with scope("ln_1"):
        h = layer_norm(x)
    with scope("attn"):
        a = attention_heads(h) + get_param("c_proj_bias")
    with scope("mlp"):
        m = mlp_hidden(h) + get_param("c_proj_bias")
    return x + a + m


parallel_block = transform(_parallel)


def _parallel_tp(x):
    with scope("ln_1"):
        h = layer_norm(x)
    with scope("attn"):
        a, a_bias = attention_heads(h), get_param("c_proj_bias")
    with scope("mlp"):
        m, m_bias = mlp_hidden(h), get_param("c_proj_bias")
    return x + lax.psum(a + m, "shard") + a_bias + m_bias


def _parallel_tp_raw_mlp_input(x):
    with scope("ln_1"):
        h = layer_norm(x)
    with scope("attn"):
        a, a_bias = attention_heads(h), get_param("c_proj_bias")
    with scope("mlp"):
        m, m_bias = mlp_hidden(x), get_param("c_proj_bias")
    return x + lax.psum(a + m, "shard") + a_bias + m_bias


def parallel_block_tp(params, x, mesh):
    return _shard(_parallel_tp, params, mesh)(params, x)


def parallel_block_tp_raw_mlp_input(params, x, mesh):
    return _shard(_parallel_tp_raw_mlp_input, params, mesh)(params, x)
