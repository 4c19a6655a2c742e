"""ZeRO-3-style training step with Nesterov momentum on a two-layer tanh MLP with square weights:
parameters and momentum buffers are row-sharded over the fsdp axis, weights are all-gathered for
the forward pass, and the gradient is brought back to the row shards.

- `nesterov_fsdp_scatter`: on {fsdp: 4}, batch also over fsdp; the gradient of the local loss is
  taken w.r.t. the gathered weights and reduced with an explicit
  `psum_scatter(..., scatter_dimension=0, tiled=True)` divided by the device count;
- `nesterov_fsdp_autodiff`: on {data: 2, fsdp: 2}, `jax.grad` is taken w.r.t. the row shards
  through `all_gather` (whose transpose reduces over fsdp), then averaged over data and divided by
  the fsdp size.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D = 16, 32
LR, MU = 0.05, 0.9


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, D), f(D, D), f(D, D), f(D, D), f(N, D), f(N, D)


def loss(w1, w2, x, y):
    return jnp.mean(jnp.square(jnp.tanh(x @ w1) @ w2 - y))


def _nesterov(w, mom, g):
    mom = MU * mom + g
    return w - LR * (g + MU * mom), mom


def train_step(w1, w2, m1, m2, x, y):
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)
    w1, m1 = _nesterov(w1, m1, g1)
    w2, m2 = _nesterov(w2, m2, g2)
    return w1, w2, m1, m2


# ---- explicit reduce-scatter --------------------------------------------------------------------

def _mean_scatter(g):
    return lax.psum_scatter(g, "fsdp", scatter_dimension=0, tiled=True) / lax.axis_size("fsdp")


def _sum_scatter(g):
    return lax.psum_scatter(g, "fsdp", scatter_dimension=0, tiled=True)


def _scatter_local(w1, w2, m1, m2, x, y, reduce):
    full1 = lax.all_gather(w1, "fsdp", axis=0, tiled=True)
    full2 = lax.all_gather(w2, "fsdp", axis=0, tiled=True)
    g1, g2 = jax.grad(loss, argnums=(0, 1))(full1, full2, x, y)
    w1, m1 = _nesterov(w1, m1, reduce(g1))
    w2, m2 = _nesterov(w2, m2, reduce(g2))
    return w1, w2, m1, m2


def _scatter(args, mesh, reduce):
    rows = P("fsdp", None)
    return jax.shard_map(lambda *a: _scatter_local(*a, reduce), mesh=mesh,
                         in_specs=(rows, rows, rows, rows, rows, rows), out_specs=(rows,) * 4,
                         check_vma=False)(*args)


def nesterov_fsdp_scatter(w1, w2, m1, m2, x, y, mesh):
    return _scatter((w1, w2, m1, m2, x, y), mesh, _mean_scatter)


def nesterov_fsdp_scatter_summed(w1, w2, m1, m2, x, y, mesh):
    return _scatter((w1, w2, m1, m2, x, y), mesh, _sum_scatter)


# ---- gradient through all_gather ----------------------------------------------------------------

def _sharded_loss(w1, w2, x, y):
    return loss(lax.all_gather(w1, "fsdp", axis=0, tiled=True),
                lax.all_gather(w2, "fsdp", axis=0, tiled=True), x, y)


def _autodiff_local(w1, w2, m1, m2, x, y, axis):
    g1, g2 = jax.grad(_sharded_loss, argnums=(0, 1))(w1, w2, x, y)
    n = lax.axis_size("fsdp")
    g1, g2 = lax.pmean(g1, axis) / n, lax.pmean(g2, axis) / n
    w1, m1 = _nesterov(w1, m1, g1)
    w2, m2 = _nesterov(w2, m2, g2)
    return w1, w2, m1, m2


def _autodiff(args, mesh, axis):
    rows, batch = P("fsdp", None), P(("data", "fsdp"), None)
    return jax.shard_map(lambda *a: _autodiff_local(*a, axis), mesh=mesh,
                         in_specs=(rows, rows, rows, rows, batch, batch), out_specs=(rows,) * 4,
                         check_vma=False)(*args)


def nesterov_fsdp_autodiff(w1, w2, m1, m2, x, y, mesh):
    return _autodiff((w1, w2, m1, m2, x, y), mesh, "data")


def nesterov_fsdp_autodiff_mean_over_fsdp(w1, w2, m1, m2, x, y, mesh):
    return _autodiff((w1, w2, m1, m2, x, y), mesh, "fsdp")
