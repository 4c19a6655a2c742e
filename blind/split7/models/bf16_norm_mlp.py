# Mixed-precision pre-norm MLP: f32 residual stream, RMSNorm statistics in f32, bf16 matmuls with
# f32 accumulation; tensor-parallel over the hidden dimension with an f32 all-reduce.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, EMBED, MLP = 2, 4, 16, 64
BF16 = jnp.bfloat16


def inputs():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, EMBED), jnp.float32),
            jax.ShapeDtypeStruct((EMBED,), jnp.float32),
            jax.ShapeDtypeStruct((EMBED, MLP), BF16),
            jax.ShapeDtypeStruct((EMBED, MLP), BF16),
            jax.ShapeDtypeStruct((MLP, EMBED), BF16))


def _rms(x, scale):
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + 1e-5)
    return (y * scale).astype(BF16)


def swiglu_block(x, scale, w_gate, w_up, w_down):
    h = _rms(x, scale)
    g = jnp.dot(h, w_gate, preferred_element_type=jnp.float32)
    u = jnp.dot(h, w_up, preferred_element_type=jnp.float32)
    a = (jax.nn.silu(g) * u).astype(BF16)
    return x + jnp.dot(a, w_down, preferred_element_type=jnp.float32)


def swiglu_block_tp(x, scale, w_gate, w_up, w_down, mesh):
    def body(x, scale, w_gate, w_up, w_down):
        h = _rms(x, scale)
        g = jnp.dot(h, w_gate, preferred_element_type=jnp.float32)
        u = jnp.dot(h, w_up, preferred_element_type=jnp.float32)
        a = (jax.nn.silu(g) * u).astype(BF16)
        return x + lax.psum(jnp.dot(a, w_down, preferred_element_type=jnp.float32), "tp")

    col, row = P(None, "tp"), P("tp", None)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), col, col, row), out_specs=P())(
        x, scale, w_gate, w_up, w_down)


def swiglu_block_tp_prenorm(x, scale, w_gate, w_up, w_down, mesh):
    def body(x, scale, w_gate, w_up, w_down):
        h = x.astype(BF16)
        g = jnp.dot(h, w_gate, preferred_element_type=jnp.float32)
        u = jnp.dot(h, w_up, preferred_element_type=jnp.float32)
        a = (jax.nn.silu(g) * u).astype(BF16)
        return x + lax.psum(jnp.dot(a, w_down, preferred_element_type=jnp.float32), "tp")

    col, row = P(None, "tp"), P("tp", None)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), col, col, row), out_specs=P())(
        x, scale, w_gate, w_up, w_down)
