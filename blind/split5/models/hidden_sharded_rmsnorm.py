# RMSNorm over a hidden dimension that is sharded over 'tp' (activations kept feature-sharded
# between two tensor-parallel layers). bf16 activations, statistics in float32.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

ROWS, HIDDEN = 6, 32


def norm_inputs():
    return (jax.ShapeDtypeStruct((ROWS, HIDDEN), jnp.bfloat16),
            jax.ShapeDtypeStruct((HIDDEN,), jnp.bfloat16))


def rmsnorm(x, weight):
    x32 = x.astype(jnp.float32)
    ms = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    return (x32 * lax.rsqrt(ms + 1e-6)).astype(jnp.bfloat16) * weight


def rmsnorm_tp(x, weight):
    def local(x, weight):
        x32 = x.astype(jnp.float32)
        ssq = lax.psum(jnp.sum(jnp.square(x32), axis=-1, keepdims=True), "tp")
        return (x32 * lax.rsqrt(ssq / HIDDEN + 1e-6)).astype(jnp.bfloat16) * weight

    return jax.shard_map(local, in_specs=(P(None, "tp"), P("tp")), out_specs=P(None, "tp"))(x, weight)


def rmsnorm_tp_local_width(x, weight):
    def local(x, weight):
        x32 = x.astype(jnp.float32)
        ssq = lax.psum(jnp.sum(jnp.square(x32), axis=-1, keepdims=True), "tp")
        return (x32 * lax.rsqrt(ssq / x.shape[-1] + 1e-6)).astype(jnp.bfloat16) * weight

    return jax.shard_map(local, in_specs=(P(None, "tp"), P("tp")), out_specs=P(None, "tp"))(x, weight)
