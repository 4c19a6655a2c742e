"""One data-parallel SGD step of a small tanh regressor (params replicated, batch over 'batch').

Returns (new params, loss). Gradients are computed per shard inside shard_map and averaged.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, DIN, DH, DOUT = 16, 8, 16, 4
LR = 0.1


class Params(NamedTuple):
    w1: jax.Array
    b1: jax.Array
    w2: jax.Array


def step_inputs():
    f = jnp.float32
    params = Params(jax.ShapeDtypeStruct((DIN, DH), f), jax.ShapeDtypeStruct((DH,), f),
                    jax.ShapeDtypeStruct((DH, DOUT), f))
    return params, jax.ShapeDtypeStruct((N, DIN), f), jax.ShapeDtypeStruct((N, DOUT), f)


def mse(params: Params, x, y):
    pred = jnp.tanh(x @ params.w1 + params.b1) @ params.w2
    return jnp.mean(jnp.sum((pred - y) ** 2, axis=-1))


def sgd_step(params, x, y):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    new = jax.tree.map(lambda p, g: p - LR * g, params, grads)
    return new, loss


def sgd_step_dp(params, x, y):
    def shard_step(params, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        grads = lax.pmean(grads, "batch")
        new = jax.tree.map(lambda p, g: p - LR * g, params, grads)
        return new, lax.pmean(loss, "batch")

    rep = Params(P(), P(), P())
    return jax.shard_map(shard_step, in_specs=(rep, P("batch"), P("batch")),
                         out_specs=(rep, P()), check_vma=False)(params, x, y)


def sgd_step_dp_summed(params, x, y):
    def shard_step(params, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        grads = lax.psum(grads, "batch")
        new = jax.tree.map(lambda p, g: p - LR * g, params, grads)
        return new, lax.pmean(loss, "batch")

    rep = Params(P(), P(), P())
    return jax.shard_map(shard_step, in_specs=(rep, P("batch"), P("batch")),
                         out_specs=(rep, P()), check_vma=False)(params, x, y)
