"""bf16 activations, LayerNorm statistics in f32, with the hidden (feature) axis sharded over
'tp': the mean and variance need all-reduces over the feature shards."""
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

ROWS, HIDDEN, TP = 6, 32, 4
EPS = 1e-6


def layernorm_bf16(x, gamma, beta):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) / jnp.sqrt(var + EPS)
    return (y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)).astype(jnp.bfloat16)


FEAT = P(None, "tp")


@partial(jax.shard_map, in_specs=(FEAT, P("tp"), P("tp")), out_specs=FEAT)
def layernorm_bf16_tp(x, gamma, beta):
    xf = x.astype(jnp.float32)
    width = HIDDEN
    mean = lax.psum(jnp.sum(xf, axis=-1, keepdims=True), "tp") / width
    centred = xf - mean
    var = lax.psum(jnp.sum(centred * centred, axis=-1, keepdims=True), "tp") / width
    y = centred / jnp.sqrt(var + EPS)
    return (y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)).astype(jnp.bfloat16)


@partial(jax.shard_map, in_specs=(FEAT, P("tp"), P("tp")), out_specs=FEAT)
def layernorm_bf16_tp_local_count(x, gamma, beta):
    xf = x.astype(jnp.float32)
    width = xf.shape[-1]
    mean = lax.psum(jnp.sum(xf, axis=-1, keepdims=True), "tp") / width
    centred = xf - mean
    var = lax.psum(jnp.sum(centred * centred, axis=-1, keepdims=True), "tp") / width
    y = centred / jnp.sqrt(var + EPS)
    return (y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)).astype(jnp.bfloat16)


def inputs():
    b = jnp.bfloat16
    return (jax.ShapeDtypeStruct((ROWS, HIDDEN), b), jax.ShapeDtypeStruct((HIDDEN,), b),
            jax.ShapeDtypeStruct((HIDDEN,), b))
