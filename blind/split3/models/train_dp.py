"""Data-parallel SGD training step for a two-layer regression MLP: forward, backward, gradient
all-reduce, update. Returns (new_params, loss)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, IN, HID, OUT = 16, 8, 16, 4
LR = 0.1


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    pred = h @ params["w2"]
    return jnp.mean(jnp.sum((pred - y) ** 2, axis=-1))


def sgd_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    new = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)
    return new, loss


def step_inputs():
    f32 = jnp.float32
    params = {
        "w1": jax.ShapeDtypeStruct((IN, HID), f32),
        "b1": jax.ShapeDtypeStruct((HID,), f32),
        "w2": jax.ShapeDtypeStruct((HID, OUT), f32),
    }
    return params, jax.ShapeDtypeStruct((BATCH, IN), f32), jax.ShapeDtypeStruct((BATCH, OUT), f32)


_PARAM_SPEC = {"w1": P(), "b1": P(), "w2": P()}


def sgd_step_dp(params, x, y, mesh):
    def replica(p, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        grads = lax.pmean(grads, "dp")
        new = jax.tree_util.tree_map(lambda w, g: w - LR * g, p, grads)
        return new, lax.pmean(loss, "dp")

    return jax.shard_map(
        replica, mesh=mesh, in_specs=(_PARAM_SPEC, P("dp"), P("dp")), out_specs=(_PARAM_SPEC, P()), check_vma=False
    )(params, x, y)


def sgd_step_dp_summed_grads(params, x, y, mesh):
    def replica(p, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        grads = lax.psum(grads, "dp")
        new = jax.tree_util.tree_map(lambda w, g: w - LR * g, p, grads)
        return new, lax.pmean(loss, "dp")

    return jax.shard_map(
        replica, mesh=mesh, in_specs=(_PARAM_SPEC, P("dp"), P("dp")), out_specs=(_PARAM_SPEC, P()), check_vma=False
    )(params, x, y)
