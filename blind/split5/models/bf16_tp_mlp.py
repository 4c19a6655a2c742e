"""bfloat16 tensor-parallel MLP with float32 accumulation (weights and activations in bf16).

Column-parallel up projection, row-parallel down projection whose f32 partial sums are
all-reduced over 'tp'; the result is returned in float32.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOKENS, D, F = 8, 32, 64
bf16 = jnp.bfloat16


def bf16_inputs():
    return (jax.ShapeDtypeStruct((TOKENS, D), bf16), jax.ShapeDtypeStruct((D, F), bf16),
            jax.ShapeDtypeStruct((F, D), bf16))


def mlp_bf16(x, w_up, w_down):
    h = jnp.dot(x, w_up, preferred_element_type=jnp.float32)
    h = jax.nn.relu(h).astype(bf16)
    return jnp.dot(h, w_down, preferred_element_type=jnp.float32)


def mlp_bf16_tp(x, w_up, w_down, mesh):
    def shard(x, w_up, w_down):
        h = lax.dot_general(x, w_up, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        h = jax.nn.relu(h).astype(bf16)
        partial = lax.dot_general(h, w_down, (((1,), (0,)), ((), ())),
                                  preferred_element_type=jnp.float32)
        return lax.psum(partial, "tp")

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)),
                         out_specs=P())(x, w_up, w_down)


def mlp_bf16_tp_reduce_in_bf16(x, w_up, w_down, mesh):
    def shard(x, w_up, w_down):
        h = lax.dot_general(x, w_up, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        h = jax.nn.relu(h).astype(bf16)
        partial = lax.dot_general(h, w_down, (((1,), (0,)), ((), ())),
                                  preferred_element_type=jnp.float32)
        return lax.psum(partial.astype(bf16), "tp")

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)),
                         out_specs=P())(x, w_up, w_down)
