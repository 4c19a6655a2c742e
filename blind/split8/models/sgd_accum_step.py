"""One training step: 2-layer MLP regression, gradient accumulation, SGD with momentum."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

GLOBAL_BATCH, N_MICRO, D_IN, D_HID = 16, 2, 8, 16
LR, MOMENTUM = 0.1, 0.9


class Params(NamedTuple):
    w1: jax.Array
    b1: jax.Array
    w2: jax.Array


def loss_fn(p, x, y):
    pred = jnp.tanh(x @ p.w1 + p.b1) @ p.w2
    return jnp.mean((pred - y) ** 2)


def sgd_update(p, mom, g):
    mom = jax.tree.map(lambda m, gi: MOMENTUM * m + gi, mom, g)
    p = jax.tree.map(lambda w, m: w - LR * m, p, mom)
    return p, mom


def train_step(params, mom, x, y):
    loss, g = jax.value_and_grad(loss_fn)(params, x, y)
    params, mom = sgd_update(params, mom, g)
    return params, mom, loss


def step_inputs():
    f = jnp.float32
    p = Params(jax.ShapeDtypeStruct((D_IN, D_HID), f), jax.ShapeDtypeStruct((D_HID,), f),
               jax.ShapeDtypeStruct((D_HID, 1), f))
    return (p, p, jax.ShapeDtypeStruct((GLOBAL_BATCH, D_IN), f),
            jax.ShapeDtypeStruct((GLOBAL_BATCH, 1), f))


def _accumulate(params, x, y):
    xs = x.reshape(N_MICRO, -1, x.shape[-1])
    ys = y.reshape(N_MICRO, -1, y.shape[-1])

    def micro(acc, batch):
        l, g = jax.value_and_grad(loss_fn)(params, *batch)
        acc_l, acc_g = acc
        return (acc_l + l / N_MICRO, jax.tree.map(lambda a, b: a + b / N_MICRO, acc_g, g)), None

    zeros = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), _ = lax.scan(micro, zeros, (xs, ys))
    return loss, grads


def train_step_dp(params, mom, x, y):
    def local(params, mom, x, y):
        loss, grads = _accumulate(params, x, y)
        grads = lax.pmean(grads, "data")
        params, mom = sgd_update(params, mom, grads)
        return params, mom, lax.pmean(loss, "data")

    rep = Params(P(), P(), P())
    fn = jax.shard_map(local, in_specs=(rep, rep, P("data"), P("data")), out_specs=(rep, rep, P()),
                       check_vma=False)
    return fn(params, mom, x, y)


def train_step_dp_v2(params, mom, x, y):
    def local(params, mom, x, y):
        loss, grads = _accumulate(params, x, y)
        grads = lax.psum(grads, "data")
        params, mom = sgd_update(params, mom, grads)
        return params, mom, lax.pmean(loss, "data")

    rep = Params(P(), P(), P())
    fn = jax.shard_map(local, in_specs=(rep, rep, P("data"), P("data")), out_specs=(rep, rep, P()),
                       check_vma=False)
    return fn(params, mom, x, y)
