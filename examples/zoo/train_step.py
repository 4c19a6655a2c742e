"""A training step: jax.grad through a tensor-parallel MLP inside shard_map on a (dp, tp)
mesh, data-parallel gradient averaging with pmean, SGD update.

Under shard_map's replication (vma) typing, a parameter that is the same on every dp shard
gets its gradient summed over dp automatically. To average per-shard gradients explicitly,
the parameters are first marked as varying over dp (lax.pcast(..., to="varying")): then
jax.grad returns each shard's own gradient and pmean averages them.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import spec

B, D, F = 8, 16, 32
LR = 0.1
DP, TP = "dp", "tp"


def _loss(params, x, y, reduce=lambda t: t):
    w1, w2 = params
    out = reduce(jnp.tanh(x @ w1) @ w2)
    return jnp.mean((out - y) ** 2)


def train_step(w1, w2, x, y):
    loss, (g1, g2) = jax.value_and_grad(_loss)((w1, w2), x, y)
    return w1 - LR * g1, w2 - LR * g2, loss


def inputs():
    return (spec(D, F), spec(F, D), spec(B, D), spec(B, D))


PARAM_SPECS = (P(None, TP), P(TP, None))


def _sharded_step(step, mesh):
    return jax.shard_map(
        step, mesh=mesh,
        in_specs=(*PARAM_SPECS, P(DP, None), P(DP, None)),
        out_specs=(*PARAM_SPECS, P()),
    )


def _tp_loss(params, x, y):
    return _loss(params, x, y, reduce=lambda t: lax.psum(t, TP))


def train_step_dp_tp(w1, w2, x, y, *, mesh):
    def step(w1, w2, x, y):
        params = lax.pcast((w1, w2), DP, to="varying")  # per-data-shard gradients
        loss, grads = jax.value_and_grad(_tp_loss)(params, x, y)
        g1, g2 = lax.pmean(grads, DP)
        return w1 - LR * g1, w2 - LR * g2, lax.pmean(loss, DP)

    return _sharded_step(step, mesh)(w1, w2, x, y)


def train_step_dp_tp_grad_sum(w1, w2, x, y, *, mesh):
    def step(w1, w2, x, y):
        params = lax.pcast((w1, w2), DP, to="varying")
        loss, grads = jax.value_and_grad(_tp_loss)(params, x, y)
        g1, g2 = lax.psum(grads, DP)  # BUG: psum instead of pmean: the gradient is dp times too large
        return w1 - LR * g1, w2 - LR * g2, lax.pmean(loss, DP)

    return _sharded_step(step, mesh)(w1, w2, x, y)


def train_step_dp_tp_no_pcast(w1, w2, x, y, *, mesh):
    def step(w1, w2, x, y):
        loss, grads = jax.value_and_grad(_tp_loss)((w1, w2), x, y)  # BUG: params not pcast to varying over dp: grads come back already summed over dp, so the pmean below averages nothing
        g1, g2 = lax.pmean(grads, DP)
        return w1 - LR * g1, w2 - LR * g2, lax.pmean(loss, DP)

    return _sharded_step(step, mesh)(w1, w2, x, y)
