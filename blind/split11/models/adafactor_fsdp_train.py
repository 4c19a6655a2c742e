"""Training steps: jax.grad through a small MLP regressor, then the optimizer update.

1. One Adafactor-style step from a fresh state (factored second moments: row and column means of
   g^2, v = r c^T / mean(r), update clipped to RMS 1) with the batch split over a 2-D
   {replica: 2, data: 4} data-parallel mesh and the gradients averaged over both axes.
2. An FSDP (ZeRO-3) SGD-with-momentum step on {fsdp: 4}: weights and momentum sharded on their
   first dim, all-gathered inside the differentiated loss (so the weight gradients come back
   reduce-scattered), the per-shard loss pre-divided by the shard count so the summed gradient is
   the global mean's.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F = 16, 16, 32
LR, BETA, EPS = 0.01, 0.9, 1e-30


def _mlp_loss(p, x, y):
    pred = jnp.tanh(x @ p["w1"]) @ p["w2"]
    return jnp.mean(jnp.sum(jnp.square(pred - y), axis=-1))


def train_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(D, F), "w2": f(F, D)}, f(N, D), f(N, D)


def _adafactor_update(p, g):
    g2 = jnp.square(g) + EPS
    row = jnp.mean(g2, axis=1)
    col = jnp.mean(g2, axis=0)
    v = jnp.outer(row, col) / jnp.mean(row)
    u = g * lax.rsqrt(v)
    u = u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(jnp.square(u))))
    return p - LR * u, {"row": row, "col": col}


def _apply(params, grads):
    out = {k: _adafactor_update(params[k], grads[k]) for k in params}
    return {k: out[k][0] for k in out}, {k: out[k][1] for k in out}


def adafactor_step(params, x, y):
    loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
    new_params, state = _apply(params, grads)
    return new_params, state, loss


def _dp_adafactor(params, x, y, grad_axes):
    loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
    grads = lax.pmean(grads, grad_axes)
    new_params, state = _apply(params, grads)
    return new_params, state, lax.pmean(loss, ("replica", "data"))


def _run_dp(params, x, y, mesh, grad_axes):
    fn = jax.shard_map(lambda p, x, y: _dp_adafactor(p, x, y, grad_axes), mesh=mesh,
                       in_specs=(P(), P(("replica", "data")), P(("replica", "data"))),
                       out_specs=(P(), P(), P()), check_vma=False)
    return fn(params, x, y)


def adafactor_step_dp(params, x, y, mesh):
    return _run_dp(params, x, y, mesh, grad_axes=("replica", "data"))


def adafactor_step_dp_one_axis(params, x, y, mesh):
    return _run_dp(params, x, y, mesh, grad_axes="data")


# ---- FSDP momentum step ---------------------------------------------------------------------------

def fsdp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D, F), "w2": f(F, D)}
    return params, {"w1": f(D, F), "w2": f(F, D)}, f(N, D), f(N, D)


def momentum_step(params, momentum, x, y):
    loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
    momentum = jax.tree.map(lambda m, g: BETA * m + g, momentum, grads)
    params = jax.tree.map(lambda p, m: p - LR * m, params, momentum)
    return params, momentum, loss


def _fsdp_step(shards, momentum, x, y, n_shards):
    def shard_loss(shards):
        full = jax.tree.map(lambda w: lax.all_gather(w, "fsdp", axis=0, tiled=True), shards)
        return _mlp_loss(full, x, y) / n_shards

    loss, grads = jax.value_and_grad(shard_loss)(shards)
    momentum = jax.tree.map(lambda m, g: BETA * m + g, momentum, grads)
    shards = jax.tree.map(lambda p, m: p - LR * m, shards, momentum)
    return shards, momentum, lax.psum(loss, "fsdp")


def _fsdp_step_unscaled(shards, momentum, x, y, n_shards):
    def shard_loss(shards):
        full = jax.tree.map(lambda w: lax.all_gather(w, "fsdp", axis=0, tiled=True), shards)
        return _mlp_loss(full, x, y)

    loss, grads = jax.value_and_grad(shard_loss)(shards)
    momentum = jax.tree.map(lambda m, g: BETA * m + g, momentum, grads)
    shards = jax.tree.map(lambda p, m: p - LR * m, shards, momentum)
    return shards, momentum, lax.psum(loss, "fsdp")


def _run_fsdp(step, params, momentum, x, y, mesh):
    n = mesh.shape["fsdp"]
    fn = jax.shard_map(lambda p, m, x, y: step(p, m, x, y, n), mesh=mesh,
                       in_specs=(P("fsdp"), P("fsdp"), P("fsdp"), P("fsdp")),
                       out_specs=(P("fsdp"), P("fsdp"), P()))
    return fn(params, momentum, x, y)


def momentum_step_fsdp(params, momentum, x, y, mesh):
    return _run_fsdp(_fsdp_step, params, momentum, x, y, mesh)


def momentum_step_fsdp_unscaled(params, momentum, x, y, mesh):
    return _run_fsdp(_fsdp_step_unscaled, params, momentum, x, y, mesh)
