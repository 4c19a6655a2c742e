# Row-parallel bf16 projection (inputs split on the contraction dim over 'fsdp'): explicit
# lax.dot_general with f32 accumulation, f32 reduce-scatter over the batch, bf16 result.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, K, M = 8, 32, 16


def inputs():
    return (jax.ShapeDtypeStruct((N, K), jnp.bfloat16), jax.ShapeDtypeStruct((K, M), jnp.bfloat16),
            jax.ShapeDtypeStruct((M,), jnp.float32))


def proj(a, w, bias):
    acc = lax.dot_general(a, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return (acc + bias).astype(jnp.bfloat16)


def proj_rowparallel(a, w, bias, mesh):
    def local(a_cols, w_rows, bias):
        acc = lax.dot_general(a_cols, w_rows, (((1,), (0,)), ((), ())),
                              preferred_element_type=jnp.float32)
        acc = lax.psum_scatter(acc, "fsdp", scatter_dimension=0, tiled=True)
        return (acc + bias).astype(jnp.bfloat16)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, "fsdp"), P("fsdp", None), P()),
                         out_specs=P("fsdp", None))(a, w, bias)
