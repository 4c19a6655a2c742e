"""Weight-only int8 linear layer with per-output-channel scales, then bias and GELU."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

M, K, N = 4, 16, 32


def dequant_linear(x, w_int8, scales, bias):
    w = w_int8.astype(jnp.float32) * scales[None, :]
    return jax.nn.gelu(x @ w + bias)


def int8_inputs():
    return (jax.ShapeDtypeStruct((M, K), jnp.float32),
            jax.ShapeDtypeStruct((K, N), jnp.int8),
            jax.ShapeDtypeStruct((N,), jnp.float32),
            jax.ShapeDtypeStruct((N,), jnp.float32))


def _col_parallel(x, w_q, scales, bias):
    n_local = w_q.shape[1]
    col0 = lax.axis_index("tp") * n_local
    acc = lax.dot_general(x, w_q.astype(jnp.float32), (((1,), (0,)), ((), ())),
                          preferred_element_type=jnp.float32)
    s = lax.dynamic_slice_in_dim(scales, col0, n_local)
    return jax.nn.gelu(acc * s + bias)


def _col_parallel_v2(x, w_q, scales, bias):
    n_local = w_q.shape[1]
    acc = lax.dot_general(x, w_q.astype(jnp.float32), (((1,), (0,)), ((), ())),
                          preferred_element_type=jnp.float32)
    s = scales[:n_local]
    return jax.nn.gelu(acc * s + bias)


def dequant_linear_tp(x, w_int8, scales, bias):
    fn = jax.shard_map(_col_parallel, in_specs=(P(), P(None, "tp"), P(), P("tp")),
                       out_specs=P(None, "tp"))
    return fn(x, w_int8, scales, bias)


def dequant_linear_tp_v2(x, w_int8, scales, bias):
    fn = jax.shard_map(_col_parallel_v2, in_specs=(P(), P(None, "tp"), P(), P("tp")),
                       out_specs=P(None, "tp"))
    return fn(x, w_int8, scales, bias)
