"""Pre-LN MLP computed in bfloat16 with float32 LayerNorm statistics and f32 matmul accumulation."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

ROWS, HID, INTER = 8, 16, 64
bf16, f32 = jnp.bfloat16, jnp.float32


def ln_f32(x, scale, bias, eps=1e-5):
    x32 = x.astype(f32)
    mean = jnp.mean(x32, -1, keepdims=True)
    var = jnp.var(x32, -1, keepdims=True)
    return ((x32 - mean) * lax.rsqrt(var + eps) * scale + bias).astype(bf16)


def mm(a, b):
    return jnp.matmul(a.astype(bf16), b.astype(bf16), preferred_element_type=f32)


def mlp_bf16(x, ln_scale, ln_bias, w1, w2):
    h = ln_f32(x, ln_scale, ln_bias)
    a = jax.nn.gelu(mm(h, w1)).astype(bf16)
    return (x.astype(f32) + mm(a, w2)).astype(bf16)


def mlp_inputs():
    return (jax.ShapeDtypeStruct((ROWS, HID), bf16), jax.ShapeDtypeStruct((HID,), f32),
            jax.ShapeDtypeStruct((HID,), f32), jax.ShapeDtypeStruct((HID, INTER), f32),
            jax.ShapeDtypeStruct((INTER, HID), f32))


def _tp_body(x, ln_scale, ln_bias, w1, w2):
    h = ln_f32(x, ln_scale, ln_bias)
    a = jax.nn.gelu(mm(h, w1)).astype(bf16)
    partial = mm(a, w2)
    return (x.astype(f32) + lax.psum(partial, "tp")).astype(bf16)


def _tp_body_v2(x, ln_scale, ln_bias, w1, w2):
    x32 = x.astype(f32)
    mu = x32.mean(-1, keepdims=True)
    h = ((x32 - mu) * lax.rsqrt(jnp.var(x32, -1, keepdims=True) + 1e-5) * ln_scale).astype(bf16)
    a = jax.nn.gelu(mm(h, w1)).astype(bf16)
    partial = mm(a, w2)
    return (x.astype(f32) + lax.psum(partial, "tp")).astype(bf16)


def mlp_bf16_tp(x, ln_scale, ln_bias, w1, w2):
    fn = jax.shard_map(_tp_body, in_specs=(P(), P(), P(), P(None, "tp"), P("tp", None)),
                       out_specs=P())
    return fn(x, ln_scale, ln_bias, w1, w2)


def mlp_bf16_tp_v2(x, ln_scale, ln_bias, w1, w2):
    fn = jax.shard_map(_tp_body_v2, in_specs=(P(), P(), P(), P(None, "tp"), P("tp", None)),
                       out_specs=P())
    return fn(x, ln_scale, ln_bias, w1, w2)
