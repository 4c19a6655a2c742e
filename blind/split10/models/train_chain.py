"""Data-parallel training steps with an optax-like chain of gradient transformations written by hand.

A GradientTransformation is a NamedTuple of (init, update) functions; the chain threads the states.
"""
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, HID = 8, 16


class GradientTransformation(NamedTuple):
    init: Callable
    update: Callable


def add_decayed_weights(wd):
    return GradientTransformation(
        init=lambda params: (),
        update=lambda g, state, params: (jax.tree.map(lambda g, p: g + wd * p, g, params), state))


def trace(decay, nesterov=False):
    def update(g, mom, params):
        mom = jax.tree.map(lambda m, g: decay * m + g, mom, g)
        out = jax.tree.map(lambda m, g: decay * m + g, mom, g) if nesterov else mom
        return out, mom
    return GradientTransformation(init=lambda params: jax.tree.map(jnp.zeros_like, params),
                                  update=update)


def scale(step_size):
    return GradientTransformation(init=lambda params: (),
                                  update=lambda g, state, params: (jax.tree.map(lambda g: step_size * g, g), state))


def chain(*transforms):
    def update(g, states, params):
        new_states = []
        for t, s in zip(transforms, states):
            g, s = t.update(g, s, params)
            new_states.append(s)
        return g, tuple(new_states)
    return GradientTransformation(init=lambda p: tuple(t.init(p) for t in transforms), update=update)


def apply_updates(params, updates):
    return jax.tree.map(jnp.add, params, updates)


def mlp(params, x):
    h = jax.nn.gelu(x @ params["dense_0"]["kernel"] + params["dense_0"]["bias"])
    return (h @ params["dense_1"]["kernel"])[:, 0]


def mse(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def _param_shapes():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"dense_0": {"kernel": f(D, HID), "bias": f(HID)}, "dense_1": {"kernel": f(HID, 1)}}


# ---- SGD + decoupled weight decay + Nesterov momentum, DP over 4 devices -----------------------

OPT = chain(add_decayed_weights(1e-2), trace(0.9, nesterov=True), scale(-0.05))


def nesterov_inputs():
    params = _param_shapes()
    state = ((), params, ())
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return params, state, f(32, D), f(32)


def train_step(params, state, x, y):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    updates, state = OPT.update(grads, state, params)
    return apply_updates(params, updates), state, loss


def _dp_step(average):
    def local(params, state, x, y):
        # differentiate the local loss only: without the pcast, grad would already sum over data
        loss, grads = jax.value_and_grad(mse)(lax.pcast(params, "data", to="varying"), x, y)
        grads = average(grads)
        updates, state = OPT.update(grads, state, params)
        return apply_updates(params, updates), state, lax.pmean(loss, "data")
    return local


def train_step_dp(params, state, x, y, mesh):
    local = _dp_step(lambda g: lax.pmean(g, "data"))
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                         out_specs=(P(), P(), P()))(params, state, x, y)


def train_step_dp_summed(params, state, x, y, mesh):
    local = _dp_step(lambda g: lax.psum(g, "data"))
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                         out_specs=(P(), P(), P()))(params, state, x, y)


# ---- gradient accumulation over microbatches, warmup schedule, 2-D (pod, dp) mesh --------------

K_MICRO, BATCH, WARMUP, BASE_LR = 2, 32, 10, 0.1


def accum_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return _param_shapes(), f(BATCH, D), f(BATCH), jax.ShapeDtypeStruct((), jnp.int32)


def learning_rate(step):
    return BASE_LR * jnp.minimum(1.0, (step + 1).astype(jnp.float32) / WARMUP)


def sgd_step(params, x, y, step):
    grads = jax.grad(mse)(params, x, y)
    return jax.tree.map(lambda p, g: p - learning_rate(step) * g, params, grads)


def _accumulated_grads(params, x, y):
    xs = x.reshape(K_MICRO, -1, D)
    ys = y.reshape(K_MICRO, -1)
    grad_fn = jax.checkpoint(jax.grad(mse))

    def body(acc, batch):
        g = grad_fn(params, *batch)
        return jax.tree.map(jnp.add, acc, g), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    acc, _ = lax.scan(body, zeros, (xs, ys))
    return jax.tree.map(lambda a: a / K_MICRO, acc)


def sgd_step_accum(params, x, y, step, mesh):
    def local(params, x, y, step):
        local_params = lax.pcast(params, ("pod", "dp"), to="varying")
        grads = lax.pmean(_accumulated_grads(local_params, x, y), ("pod", "dp"))
        return jax.tree.map(lambda p, g: p - learning_rate(step) * g, params, grads)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(("pod", "dp")), P(("pod", "dp")), P()),
                         out_specs=P())(params, x, y, step)


def sgd_step_accum_dp_only(params, x, y, step, mesh):
    def local(params, x, y, step):
        local_params = lax.pcast(params, ("pod", "dp"), to="varying")
        grads = lax.pmean(_accumulated_grads(local_params, x, y), "dp")
        return jax.tree.map(lambda p, g: p - learning_rate(step) * g, params, grads)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(("pod", "dp")), P(("pod", "dp")), P()),
                         out_specs=P(), check_vma=False)(params, x, y, step)
