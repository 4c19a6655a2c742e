"""Training step with gradient accumulation over microbatches (lax.scan) and SGD with momentum.
The sharded version is plain jit with sharding constraints: the batch is split over 'data'."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class Hyper:
    micro_steps: int = 4
    micro_batch: int = 4
    features: int = 8
    lr: float = 0.05
    momentum: float = 0.9


HP = Hyper()


def _loss(w, xb, yb):
    logits = xb @ w
    return jnp.mean(jax.nn.softplus(-yb * logits))


def _update(w, velocity, grad):
    velocity = HP.momentum * velocity + grad
    return w - HP.lr * velocity, velocity


def accumulate_step(w, velocity, x, y):
    xs = x.reshape(HP.micro_steps, HP.micro_batch, HP.features)
    ys = y.reshape(HP.micro_steps, HP.micro_batch, 1)

    def micro(acc, batch):
        return acc + jax.grad(_loss)(w, *batch), None

    total, _ = jax.lax.scan(micro, jnp.zeros_like(w), (xs, ys))
    return _update(w, velocity, total / HP.micro_steps)


def accumulate_inputs():
    f32 = jnp.float32
    n = HP.micro_steps * HP.micro_batch
    return (
        jax.ShapeDtypeStruct((HP.features, 1), f32),
        jax.ShapeDtypeStruct((HP.features, 1), f32),
        jax.ShapeDtypeStruct((n, HP.features), f32),
        jax.ShapeDtypeStruct((n, 1), f32),
    )


def accumulate_step_sharded(w, velocity, x, y, mesh):
    batch_split = NamedSharding(mesh, P(None, "data", None))
    xs = jax.lax.with_sharding_constraint(x.reshape(HP.micro_steps, HP.micro_batch, HP.features), batch_split)
    ys = jax.lax.with_sharding_constraint(y.reshape(HP.micro_steps, HP.micro_batch, 1), batch_split)

    def micro(acc, batch):
        return acc + jax.grad(_loss)(w, *batch), None

    total, _ = jax.lax.scan(micro, jnp.zeros_like(w), (xs, ys))
    return _update(w, velocity, total / HP.micro_steps)


def accumulate_step_sharded_sum(w, velocity, x, y, mesh):
    batch_split = NamedSharding(mesh, P(None, "data", None))
    xs = jax.lax.with_sharding_constraint(x.reshape(HP.micro_steps, HP.micro_batch, HP.features), batch_split)
    ys = jax.lax.with_sharding_constraint(y.reshape(HP.micro_steps, HP.micro_batch, 1), batch_split)

    def micro(acc, batch):
        return acc + jax.grad(_loss)(w, *batch), None

    total, _ = jax.lax.scan(micro, jnp.zeros_like(w), (xs, ys))
    return _update(w, velocity, total)
