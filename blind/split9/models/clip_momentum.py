"""One training step: MSE regression through a GELU MLP, gradient clipping by global norm, SGD
with momentum and decoupled weight decay (optax-style chain written by hand).

Tensor-parallel version: forward is a shard_map (column/row-parallel), gradients come from
jax.value_and_grad through it, and the optimizer runs per parameter shard in a second shard_map,
where the global gradient norm needs the psum of the shards' sums of squares.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

D, F, B = 8, 16, 8
LR, BETA, WD, MAX_NORM = 0.1, 0.9, 0.01, 0.05


def step_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D, F), "w2": f(F, D)}
    return params, dict(params), f(B, D), f(B, D)


def mse(params, x, y):
    pred = jax.nn.gelu(x @ params["w1"]) @ params["w2"]
    return jnp.mean((pred - y) ** 2)


def clip_by_global_norm(grads, max_norm):
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    factor = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree.map(lambda g: g * factor, grads)


def train_step(params, momentum, x, y):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    grads = clip_by_global_norm(grads, MAX_NORM)
    momentum = jax.tree.map(lambda m, g: BETA * m + g, momentum, grads)
    params = jax.tree.map(lambda p, m: p - LR * (m + WD * p), params, momentum)
    return params, momentum, loss


PARAM_SPECS = {"w1": P(None, "tp"), "w2": P("tp", None)}


def _mse_tp(params, x, y, mesh):
    def fwd(w1, w2, x, y):
        pred = jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp")
        return jnp.mean((pred - y) ** 2)

    return jax.shard_map(fwd, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P(), P()),
                         out_specs=P())(params["w1"], params["w2"], x, y)


def _global_sq_norm(grads):
    return jax.lax.psum(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)), "tp")


def _shard_sq_norm(grads):
    return sum(jnp.sum(g * g) for g in jax.tree.leaves(grads))


def _sharded_update(params, momentum, grads, mesh, sq_norm):
    def update(params, momentum, grads):
        sq = sq_norm(grads)
        factor = jnp.minimum(1.0, MAX_NORM / (jnp.sqrt(sq) + 1e-6))
        momentum = jax.tree.map(lambda m, g: BETA * m + g * factor, momentum, grads)
        params = jax.tree.map(lambda p, m: p - LR * (m + WD * p), params, momentum)
        return params, momentum

    return jax.shard_map(update, mesh=mesh, in_specs=(PARAM_SPECS,) * 3,
                         out_specs=(PARAM_SPECS, PARAM_SPECS))(params, momentum, grads)


def train_step_tp(params, momentum, x, y, mesh):
    loss, grads = jax.value_and_grad(_mse_tp)(params, x, y, mesh)
    params, momentum = _sharded_update(params, momentum, grads, mesh, _global_sq_norm)
    return params, momentum, loss


def train_step_tp_v2(params, momentum, x, y, mesh):
    loss, grads = jax.value_and_grad(_mse_tp)(params, x, y, mesh)
    params, momentum = _sharded_update(params, momentum, grads, mesh, _shard_sq_norm)
    return params, momentum, loss
