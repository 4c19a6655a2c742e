"""Mixed precision: f32 master weights and residual stream, bf16 matmuls with f32 accumulation,
norms computed in f32 and cast to bf16 before the next matmul.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, F, V = 4, 4, 32, 64, 32
BF16, F32 = jnp.bfloat16, jnp.float32
_MATMUL = (((2,), (0,)), ((), ()))


def _mm(a, w):
    """bf16 x bf16 -> f32 accumulate."""
    return lax.dot_general(a.astype(BF16), w.astype(BF16), _MATMUL, preferred_element_type=F32)


def _rms(x, scale):
    x32 = x.astype(F32)
    inv = lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + 1e-6)
    return (x32 * inv * scale).astype(BF16)


def ffn_block(scale, w_gate, w_up, w_down, x):
    h = _rms(x, scale)
    act = (jax.nn.silu(_mm(h, w_gate)) * _mm(h, w_up)).astype(BF16)
    return x + _mm(act, w_down)


def ffn_block_inputs():
    return (jax.ShapeDtypeStruct((D,), F32), jax.ShapeDtypeStruct((D, F), F32),
            jax.ShapeDtypeStruct((D, F), F32), jax.ShapeDtypeStruct((F, D), F32),
            jax.ShapeDtypeStruct((B, S, D), F32))


def ffn_block_tp(scale, w_gate, w_up, w_down, x, mesh):
    def local(scale, w_gate, w_up, w_down, x):
        h = _rms(x, scale)
        act = (jax.nn.silu(_mm(h, w_gate)) * _mm(h, w_up)).astype(BF16)
        return x + lax.psum(_mm(act, w_down), "tp")

    col, row = P(None, "tp"), P("tp", None)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), col, col, row, P()),
                         out_specs=P())(scale, w_gate, w_up, w_down, x)


def lm_head(scale, w_head, x):
    """Final RMSNorm and unembedding; f32 logits."""
    return _mm(_rms(x, scale), w_head)


def lm_head_inputs():
    return (jax.ShapeDtypeStruct((D,), F32), jax.ShapeDtypeStruct((D, V), F32),
            jax.ShapeDtypeStruct((B, S, D), F32))


_HEAD_SPECS = (P("tp"), P("tp", None), P(None, None, "tp"))


def lm_head_tp(scale, w_head, x, mesh):
    """The residual stream is sharded over its hidden dim; the norm's mean square is all-reduced."""

    def local(scale, w_head, x):
        x32 = x.astype(F32)
        sq = lax.psum(jnp.sum(jnp.square(x32), axis=-1, keepdims=True), "tp")
        h = (x32 * lax.rsqrt(sq / D + 1e-6) * scale).astype(BF16)
        return lax.psum(_mm(h, w_head), "tp")

    return jax.shard_map(local, mesh=mesh, in_specs=_HEAD_SPECS, out_specs=P())(scale, w_head, x)


def lm_head_tp_v2(scale, w_head, x, mesh):
    def local(scale, w_head, x):
        x32 = x.astype(F32)
        sq = jnp.sum(jnp.square(x32), axis=-1, keepdims=True) * lax.axis_size("tp")
        h = (x32 * lax.rsqrt(sq / D + 1e-6) * scale).astype(BF16)
        return lax.psum(_mm(h, w_head), "tp")

    return jax.shard_map(local, mesh=mesh, in_specs=_HEAD_SPECS, out_specs=P())(scale, w_head, x)


def lm_head_tp_v3(scale, w_head, x, mesh):
    def local(scale, w_head, x):
        x32 = x.astype(F32)
        sq = lax.psum(jnp.sum(jnp.square(x32), axis=-1, keepdims=True), "tp")
        h = (x32 * lax.rsqrt(sq / D + 1e-6) * scale).astype(BF16)
        return lax.psum(_mm(h, w_head).astype(BF16), "tp")

    return jax.shard_map(local, mesh=mesh, in_specs=_HEAD_SPECS, out_specs=P())(scale, w_head, x)
