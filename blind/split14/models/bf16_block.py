"""bfloat16 pre-LN transformer block in the T5X / MaxText mixed-precision style: parameters and
activations in bf16, LayerNorm statistics in f32 (upcast, normalise, cast back), every matmul a
`lax.dot_general` / einsum with `preferred_element_type=jnp.float32` (f32 accumulation) whose
result is cast back to bf16, softmax in f32; causal multi-head attention and a GELU MLP.

- `block_bf16_mp`: {mp: 4}, heads and MLP hidden sharded, the f32 partial outputs psum-reduced over
  mp and then cast to bf16;
- `block_bf16_dp_mp`: {dp: 2, mp: 2}, batch over dp, the partial outputs cast to bf16 first and
  reduced in bf16 by the psum; LayerNorm written with `jnp.var` in a separate helper.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD, F = 4, 8, 32, 4, 8, 64
BF16, F32 = jnp.bfloat16, jnp.float32


def bf16_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, BF16)
    params = {"ln1": {"scale": f(D), "bias": f(D)}, "ln2": {"scale": f(D), "bias": f(D)},
              "qkv": f(3, D, H, HD), "out": f(H, HD, D), "wi": f(D, F), "wo": f(F, D)}
    return params, f(B, S, D)


def layer_norm(x, p):
    xf = x.astype(F32)
    mu = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mu).mean(-1, keepdims=True)
    return ((xf - mu) * lax.rsqrt(var + 1e-6) * p["scale"].astype(F32)
            + p["bias"].astype(F32)).astype(BF16)


def mm(x, w):
    """[..., K] x [K, N] with f32 accumulation."""
    return lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=F32)


def attention_partial(p, h):
    q, k, v = (jnp.einsum("bsd,dhe->bhse", h, p["qkv"][i], preferred_element_type=F32).astype(BF16)
               for i in range(3))
    logits = jnp.einsum("bhqe,bhke->bhqk", q, k, preferred_element_type=F32) * HD ** -0.5
    causal = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
    probs = jax.nn.softmax(jnp.where(causal, logits, -1e30), axis=-1).astype(BF16)
    o = jnp.einsum("bhqk,bhke->bhqe", probs, v, preferred_element_type=F32).astype(BF16)
    return jnp.einsum("bhqe,hed->bqd", o, p["out"], preferred_element_type=F32)


def mlp_partial(p, h):
    u = mm(h, p["wi"])
    return mm(jax.nn.gelu(u).astype(BF16), p["wo"])


def block(p, x):
    x = x + attention_partial(p, layer_norm(x, p["ln1"])).astype(BF16)
    return x + mlp_partial(p, layer_norm(x, p["ln2"])).astype(BF16)


def _specs():
    ln = {"scale": P(), "bias": P()}
    return {"ln1": ln, "ln2": ln, "qkv": P(None, None, "mp"), "out": P("mp"),
            "wi": P(None, "mp"), "wo": P("mp")}


# ---- {mp: 4}: f32 psum then cast ----------------------------------------------------------------

def _mp_local(p, x):
    h = x + lax.psum(attention_partial(p, layer_norm(x, p["ln1"])), "mp").astype(BF16)
    return h + lax.psum(mlp_partial(p, layer_norm(h, p["ln2"])), "mp").astype(BF16)


def _mp_local_stale_mlp_input(p, x):
    h = x + lax.psum(attention_partial(p, layer_norm(x, p["ln1"])), "mp").astype(BF16)
    return h + lax.psum(mlp_partial(p, layer_norm(x, p["ln2"])), "mp").astype(BF16)


def block_bf16_mp(params, x, mesh):
    return jax.shard_map(_mp_local, mesh=mesh, in_specs=(_specs(), P()), out_specs=P())(params, x)


def block_bf16_mp_stale_mlp_input(params, x, mesh):
    return jax.shard_map(_mp_local_stale_mlp_input, mesh=mesh, in_specs=(_specs(), P()),
                         out_specs=P())(params, x)


# ---- {dp: 2, mp: 2}: bf16 psum ------------------------------------------------------------------

def ln_var(x, p):
    xf = x.astype(F32)
    y = (xf - xf.mean(axis=-1, keepdims=True)) / jnp.sqrt(jnp.var(xf, axis=-1, keepdims=True) + 1e-6)
    return (y * p["scale"].astype(F32) + p["bias"].astype(F32)).astype(BF16)


def ln_var_seq_axis(x, p):
    xf = x.astype(F32)
    y = (xf - xf.mean(axis=1, keepdims=True)) / jnp.sqrt(jnp.var(xf, axis=1, keepdims=True) + 1e-6)
    return (y * p["scale"].astype(F32) + p["bias"].astype(F32)).astype(BF16)


def _dp_mp_local(norm):
    def local(p, x):
        x = x + lax.psum(attention_partial(p, norm(x, p["ln1"])).astype(BF16), "mp")
        return x + lax.psum(mlp_partial(p, norm(x, p["ln2"])).astype(BF16), "mp")
    return local


def block_bf16_dp_mp(params, x, mesh):
    return jax.shard_map(_dp_mp_local(ln_var), mesh=mesh, in_specs=(_specs(), P("dp")),
                         out_specs=P("dp"))(params, x)


def block_bf16_dp_mp_norm_over_seq(params, x, mesh):
    return jax.shard_map(_dp_mp_local(ln_var_seq_axis), mesh=mesh, in_specs=(_specs(), P("dp")),
                         out_specs=P("dp"))(params, x)
