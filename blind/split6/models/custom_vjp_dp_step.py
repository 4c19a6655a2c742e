"""Data-parallel SGD-with-momentum step for a 2-layer MLP whose activation has a hand-written
custom_vjp (a numerically safe softplus). The per-device gradients are averaged over 'dp'."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, D_IN, D_HID, D_OUT, DP = 8, 4, 8, 2, 4
LR, MOMENTUM = 0.1, 0.9


@jax.custom_vjp
def safe_softplus(x):
    return jnp.logaddexp(x, 0.0)


def _softplus_fwd(x):
    return safe_softplus(x), x


def _softplus_bwd(x, g):
    return (g * jax.nn.sigmoid(x),)


safe_softplus.defvjp(_softplus_fwd, _softplus_bwd)


class Params(NamedTuple):
    w1: jax.Array
    w2: jax.Array


def mse(params, x, y):
    pred = safe_softplus(x @ params.w1) @ params.w2
    return jnp.mean(jnp.sum((pred - y) ** 2, axis=-1))


def sgd_momentum(params, velocity, grads):
    velocity = jax.tree.map(lambda v, g: MOMENTUM * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - LR * v, params, velocity)
    return params, velocity


def train_step(params, velocity, x, y):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    params, velocity = sgd_momentum(params, velocity, grads)
    return params, velocity, loss


def _dp_step(all_reduce):
    def local(params, velocity, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        grads = jax.tree.map(all_reduce, grads)
        params, velocity = sgd_momentum(params, velocity, grads)
        return params, velocity, lax.pmean(loss, "dp")

    return jax.shard_map(local, in_specs=(P(), P(), P("dp"), P("dp")), out_specs=(P(), P(), P()),
                         check_vma=False)


def train_step_dp(params, velocity, x, y):
    return _dp_step(lambda g: lax.pmean(g, "dp"))(params, velocity, x, y)


def train_step_dp_psum(params, velocity, x, y):
    return _dp_step(lambda g: lax.psum(g, "dp"))(params, velocity, x, y)


def inputs():
    f = jnp.float32
    p = Params(jax.ShapeDtypeStruct((D_IN, D_HID), f), jax.ShapeDtypeStruct((D_HID, D_OUT), f))
    return p, p, jax.ShapeDtypeStruct((BATCH, D_IN), f), jax.ShapeDtypeStruct((BATCH, D_OUT), f)
