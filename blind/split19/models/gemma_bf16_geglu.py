"""Gemma-style feed-forward sub-layer in mixed precision: RMSNorm computed in float32 with a
zero-centred scale `(1 + w)`, the normalised activations cast to bfloat16, a GeGLU (tanh GELU)
whose bf16 matmuls accumulate in float32 (`preferred_element_type`), and the f32 residual add.

- `geglu_tp`: on {tp: 4}, GeGLU columns and down-projection rows over tp, f32 psum;
- `geglu_hidden_sharded`: on {tp: 4}, the residual stream itself sharded over its hidden dim: the
  norm's sum of squares is psum'd in f32, the gate/up projections reduce over hidden shards (psum
  of f32 partials) and the down projection writes the device's hidden columns.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, F = 2, 8, 64, 64
BF = jnp.bfloat16


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D), f(D, F), f(D, F), f(F, D), f(B, T, D)


def _mm(a, w):
    return jnp.einsum("btd,df->btf", a.astype(BF), w.astype(BF), preferred_element_type=jnp.float32)


def _geglu(gate, up):
    return (jax.nn.gelu(gate, approximate=True) * up).astype(BF)


def ffn(norm_w, w_gate, w_up, w_down, x):
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    h = x * lax.rsqrt(ms + 1e-6) * (1.0 + norm_w)
    return x + _mm(_geglu(_mm(h, w_gate), _mm(h, w_up)), w_down)


# ---- GeGLU columns over tp ----------------------------------------------------------------------

def _zero_centred(w):
    return 1.0 + w


def _raw_scale(w):
    return w


def _tp_local(norm_w, w_gate, w_up, w_down, x, scale):
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    h = x * lax.rsqrt(ms + 1e-6) * scale(norm_w)
    return x + lax.psum(_mm(_geglu(_mm(h, w_gate), _mm(h, w_up)), w_down), "tp")


def _tp(args, mesh, scale):
    return jax.shard_map(lambda *a: _tp_local(*a, scale), mesh=mesh,
                         in_specs=(P(), P(None, "tp"), P(None, "tp"), P("tp", None), P()),
                         out_specs=P(), check_vma=False)(*args)


def geglu_tp(norm_w, w_gate, w_up, w_down, x, mesh):
    return _tp((norm_w, w_gate, w_up, w_down, x), mesh, _zero_centred)


def geglu_tp_scale_not_offset(norm_w, w_gate, w_up, w_down, x, mesh):
    return _tp((norm_w, w_gate, w_up, w_down, x), mesh, _raw_scale)


# ---- residual stream sharded over hidden --------------------------------------------------------

def _mean_square_all_shards(x):
    return lax.psum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), "tp") / D


def _mean_square_local_shard(x):
    return jnp.sum(jnp.square(x), axis=-1, keepdims=True) / D


def _hidden_local(norm_w, w_gate, w_up, w_down, x, mean_square):
    h = x * lax.rsqrt(mean_square(x) + 1e-6) * (1.0 + norm_w)
    gate = lax.psum(_mm(h, w_gate), "tp")
    up = lax.psum(_mm(h, w_up), "tp")
    return x + _mm(_geglu(gate, up), w_down)


def _hidden(args, mesh, mean_square):
    return jax.shard_map(lambda *a: _hidden_local(*a, mean_square), mesh=mesh,
                         in_specs=(P("tp"), P("tp", None), P("tp", None), P(None, "tp"),
                                   P(None, None, "tp")),
                         out_specs=P(None, None, "tp"), check_vma=False)(*args)


def geglu_hidden_sharded(norm_w, w_gate, w_up, w_down, x, mesh):
    return _hidden((norm_w, w_gate, w_up, w_down, x), mesh, _mean_square_all_shards)


def geglu_hidden_sharded_local_norm(norm_w, w_gate, w_up, w_down, x, mesh):
    return _hidden((norm_w, w_gate, w_up, w_down, x), mesh, _mean_square_local_shard)
