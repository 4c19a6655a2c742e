"""bf16 projection after an RMSNorm whose hidden dimension is sharded.

Statistics are computed in float32, the normalised activations are cast to bfloat16 and the
matmul accumulates in float32 (preferred_element_type). In the tensor-parallel version the hidden
dimension (norm weight, input features, weight rows) is split over `tp`, so the mean square needs
an all-reduce and the projection is a partial sum.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

D, OUT, EPS = 32, 16, 1e-6


def make_args():
    return (jax.ShapeDtypeStruct((4, 6, D), jnp.float32),
            jax.ShapeDtypeStruct((D,), jnp.float32),
            jax.ShapeDtypeStruct((D, OUT), jnp.bfloat16))


def norm_project(x, gamma, w):
    x32 = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + EPS)
    h = (x32 * inv * gamma).astype(jnp.bfloat16)
    return jnp.einsum("bsd,do->bso", h, w, preferred_element_type=jnp.float32)


def _mean_square(x):
    return jax.lax.psum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), "tp") / D


def _mean_square_local(x):
    return jnp.sum(jnp.square(x), axis=-1, keepdims=True) / D


def _local(x, gamma, w, mean_square):
    inv = jax.lax.rsqrt(mean_square(x) + EPS)
    h = (x * inv * gamma).astype(jnp.bfloat16)
    part = jax.lax.dot_general(h, w, (((2,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return jax.lax.psum(part, "tp")


def _tp(x, gamma, w, mesh, mean_square):
    def body(x, gamma, w):
        return _local(x, gamma, w, mean_square)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, None, "tp"), P("tp"), P("tp", None)),
                         out_specs=P(), check_vma=False)(x, gamma, w)


def norm_project_tp(x, gamma, w, mesh):
    return _tp(x, gamma, w, mesh, _mean_square)


def norm_project_tp_local_stats(x, gamma, w, mesh):
    return _tp(x, gamma, w, mesh, _mean_square_local)
