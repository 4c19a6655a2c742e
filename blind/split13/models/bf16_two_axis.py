"""bfloat16 activations and weights, float32 where it matters: LayerNorm statistics and the softmax
in f32, every matmul accumulated in f32 (`preferred_element_type`), casts back to bf16 at the
sub-layer boundary. Mesh {x: 2, y: 4}.

1. `ln_mlp`: pre-LayerNorm (with bias) GELU MLP with biases, fan-in multipliers applied at use;
   the sharded version splits the hidden dim over both mesh axes at once (`P(None, ("x", "y"))`,
   8 shards) and all-reduces the f32 partial outputs over ("x", "y") before the output bias, the
   residual and the cast.
2. `attention`: causal attention sub-layer (the caller adds the residual), batch over x and heads
   over y; logits and softmax in f32, probabilities cast to bf16 for the value contraction, the
   output projection psum-reduced in f32 before the cast.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BF, F32 = jnp.bfloat16, jnp.float32
B, S, D, F, H, HD = 4, 8, 32, 128, 4, 8
BOTH = ("x", "y")


def _mm(a, b, spec):
    return jnp.einsum(spec, a, b, preferred_element_type=F32)


def _dense(a, kernel, spec, fan_in):
    # kernels are stored at unit scale; the 1/sqrt(fan_in) multiplier is applied at use (muP-style)
    return _mm(a, kernel, spec) * fan_in ** -0.5


def layer_norm(x, g, b):
    xf = x.astype(F32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
    return ((xf - mu) * lax.rsqrt(var + 1e-5) * g.astype(F32) + b.astype(F32)).astype(BF)


# ---- 1. LayerNorm + MLP, hidden over both axes ---------------------------------------------------

def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, BF)
    return {"g": f(D), "b": f(D), "w_up": f(D, F), "b_up": f(F), "w_down": f(F, D),
            "b_down": f(D)}, f(B, S, D)


def _hidden(p, x):
    h = layer_norm(x, p["g"], p["b"])
    up = _dense(h, p["w_up"], "bsd,df->bsf", D) + p["b_up"].astype(F32)
    return _dense(jax.nn.gelu(up).astype(BF), p["w_down"], "bsf,fd->bsd", F)


def ln_mlp(p, x):
    y = _hidden(p, x) + p["b_down"].astype(F32)
    return (x.astype(F32) + y).astype(BF)


MLP_SPECS = {"g": P(), "b": P(), "w_up": P(None, BOTH), "b_up": P(BOTH), "w_down": P(BOTH),
             "b_down": P()}


def _mlp_local(p, x):
    y = lax.psum(_hidden(p, x), BOTH) + p["b_down"].astype(F32)
    return (x.astype(F32) + y).astype(BF)


def _mlp_local_bias_in_sum(p, x):
    y = lax.psum(_hidden(p, x) + p["b_down"].astype(F32), BOTH)
    return (x.astype(F32) + y).astype(BF)


def ln_mlp_two_axis(p, x, mesh):
    return jax.shard_map(_mlp_local, mesh=mesh, in_specs=(MLP_SPECS, P()), out_specs=P())(p, x)


def ln_mlp_two_axis_bias_in_sum(p, x, mesh):
    return jax.shard_map(_mlp_local_bias_in_sum, mesh=mesh, in_specs=(MLP_SPECS, P()),
                         out_specs=P())(p, x)


# ---- 2. attention, batch over x, heads over y ---------------------------------------------------

def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, BF)
    return {"g": f(D), "b": f(D), "wqkv": f(3, D, H, HD), "wo": f(H, HD, D)}, f(B, S, D)


def _attn_partial(p, x, scaled):
    h = layer_norm(x, p["g"], p["b"])
    q, k, v = (_dense(h, p["wqkv"][i], "bsd,dhk->bshk", D).astype(BF) for i in range(3))
    logits = _mm(q, k, "bqhk,bshk->bhqs")
    if scaled:
        logits = logits * (HD ** -0.5)
    causal = jnp.tril(jnp.ones((S, S), bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), axis=-1).astype(BF)
    o = _mm(probs, v, "bhqs,bshk->bqhk").astype(BF)
    return _dense(o, p["wo"], "bqhk,hkd->bqd", H * HD)


def attention(p, x):
    return _attn_partial(p, x, True).astype(BF)


ATTN_SPECS = {"g": P(), "b": P(), "wqkv": P(None, None, "y"), "wo": P("y")}


def _attn_local(p, x):
    return lax.psum(_attn_partial(p, x, True), "y").astype(BF)


def _attn_local_unscaled(p, x):
    return lax.psum(_attn_partial(p, x, False), "y").astype(BF)


def attention_dp_tp(p, x, mesh):
    return jax.shard_map(_attn_local, mesh=mesh, in_specs=(ATTN_SPECS, P("x")),
                         out_specs=P("x"))(p, x)


def attention_dp_tp_unscaled(p, x, mesh):
    return jax.shard_map(_attn_local_unscaled, mesh=mesh, in_specs=(ATTN_SPECS, P("x")),
                         out_specs=P("x"))(p, x)
