"""One SGD-with-momentum training step of a two-layer regression MLP."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, F, BATCH = 16, 32, 16
LR, MOMENTUM, WEIGHT_DECAY, MAX_NORM = 0.05, 0.9, 1e-2, 1.0
MICROBATCHES = 2


class TrainState(NamedTuple):
    params: dict
    momentum: dict


def predict(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def mse(params, x, y):
    return jnp.mean(jnp.square(predict(params, x) - y))


def apply_sgd(state: TrainState, grads, decay=0.0) -> TrainState:
    grads = jax.tree.map(lambda g, p: g + decay * p, grads, state.params)
    momentum = jax.tree.map(lambda m, g: MOMENTUM * m + g, state.momentum, grads)
    params = jax.tree.map(lambda p, m: p - LR * m, state.params, momentum)
    return TrainState(params, momentum)


def clip_by_global_norm(grads, max_norm):
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree.map(lambda g: g * scale, grads)


def train_step(state: TrainState, x, y):
    loss, grads = jax.value_and_grad(mse)(state.params, x, y)
    return apply_sgd(state, grads), loss


def train_step_clipped(state: TrainState, x, y):
    loss, grads = jax.value_and_grad(mse)(state.params, x, y)
    grads = clip_by_global_norm(grads, MAX_NORM)
    return apply_sgd(state, grads, WEIGHT_DECAY), loss


def train_inputs():
    f32 = jnp.float32
    params = {"w1": jax.ShapeDtypeStruct((D, F), f32), "w2": jax.ShapeDtypeStruct((F, D), f32)}
    return (TrainState(params, params), jax.ShapeDtypeStruct((BATCH, D), f32),
            jax.ShapeDtypeStruct((BATCH, D), f32))


# ---------------------------------------------------------------- grad through shard_map (DP x TP)
def train_step_dp_tp(state: TrainState, x, y, mesh):
    n_data = mesh.shape["dp"]

    @jax.shard_map(mesh=mesh, in_specs=({"w1": P(None, "tp"), "w2": P("tp", None)}, P("dp"), P("dp")),
                   out_specs=P())
    def loss_fn(params, x, y):
        pred = lax.psum(jnp.tanh(x @ params["w1"]) @ params["w2"], "tp")
        return lax.psum(jnp.sum(jnp.square(pred - y)), "dp") / (y.size * n_data)

    loss, grads = jax.value_and_grad(loss_fn)(state.params, x, y)
    return apply_sgd(state, grads), loss


# ---------------------------------------------------------------- DP with gradient accumulation
def _accumulated_grads(params, x, y):
    """Mean loss and gradient over this shard's batch, one microbatch at a time."""
    xs = x.reshape(MICROBATCHES, -1, D)
    ys = y.reshape(MICROBATCHES, -1, D)

    def micro(acc, batch):
        loss, grads = jax.value_and_grad(mse)(params, *batch)
        return jax.tree.map(jnp.add, acc, (loss, grads)), None

    zero = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), _ = lax.scan(micro, zero, (xs, ys))
    return jax.tree.map(lambda t: t / MICROBATCHES, (loss, grads))


def train_step_accum(state: TrainState, x, y, mesh):
    def step(state, x, y):
        loss, grads = _accumulated_grads(state.params, x, y)
        grads = lax.pmean(grads, "dp")
        grads = clip_by_global_norm(grads, MAX_NORM)
        return apply_sgd(state, grads, WEIGHT_DECAY), lax.pmean(loss, "dp")

    fn = jax.shard_map(step, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=(P(), P()),
                       check_vma=False)
    return fn(state, x, y)


def train_step_accum_noclip(state: TrainState, x, y, mesh):
    def step(state, x, y):
        loss, grads = _accumulated_grads(state.params, x, y)
        grads = lax.psum(grads, "dp")
        return apply_sgd(state, grads), lax.pmean(loss, "dp")

    fn = jax.shard_map(step, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=(P(), P()),
                       check_vma=False)
    return fn(state, x, y)
