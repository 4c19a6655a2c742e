"""FSDP training step written with jax.tree_util over a parameter dict: a three-layer GELU MLP,
mean-squared loss, SGD with heavy-ball momentum and decoupled weight decay; params and momenta
stay sharded, every leaf is all_gathered before the forward and its gradient reduce-scattered.

- `fsdp_rows`: shard_map on {fsdp: 4}; every leaf split along its first axis, batch over fsdp,
  gradients psum_scatter'd and divided by the fsdp size;
- `hsdp_cols`: on {dp: 2, fsdp: 2}; every leaf split along its last axis over fsdp, replicated over
  dp, batch over (dp, fsdp); gradients psum_scatter'd over fsdp and pmean'd over dp.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, DIN, DH, DOUT = 16, 16, 32, 8
LR, MU, WD = 0.05, 0.9, 0.01
tm = jax.tree_util.tree_map


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(DIN, DH), "b1": f(DH), "w2": f(DH, DH), "b2": f(DH), "w3": f(DH, DOUT)}
    return params, dict(params), f(N, DIN), f(N, DOUT)


def _loss(p, x, y):
    h = jax.nn.gelu(x @ p["w1"] + p["b1"])
    h = jax.nn.gelu(h @ p["w2"] + p["b2"])
    return jnp.mean((h @ p["w3"] - y) ** 2)


def _sgd(p, mom, g):
    mom = tm(lambda m, g: MU * m + g, mom, g)
    return tm(lambda p, m: p - LR * (m + WD * p), p, mom), mom


def train_step(params, mom, x, y):
    return _sgd(params, mom, jax.grad(_loss)(params, x, y))


def _rows_local(p, mom, x, y, reduce):
    full = tm(lambda a: lax.all_gather(a, "fsdp", axis=0, tiled=True), p)
    g = jax.grad(_loss)(full, x, y)
    g = tm(reduce, g)
    return _sgd(p, mom, g)


def _rows(p, mom, x, y, mesh, reduce):
    spec = tm(lambda _: P("fsdp"), p)
    return jax.shard_map(lambda *a: _rows_local(*a, reduce), mesh=mesh, in_specs=(spec, spec, P("fsdp"), P("fsdp")),
                         out_specs=(spec, spec), check_vma=False)(p, mom, x, y)


def fsdp_rows(params, mom, x, y, mesh):
    return _rows(params, mom, x, y, mesh, lambda g: lax.psum_scatter(g, "fsdp", scatter_dimension=0, tiled=True) / 4)


def fsdp_rows_grad_not_averaged(params, mom, x, y, mesh):
    return _rows(params, mom, x, y, mesh, lambda g: lax.psum_scatter(g, "fsdp", scatter_dimension=0, tiled=True))


def _last(a):
    return P(*([None] * (a.ndim - 1)), "fsdp")


def _scatter_cols(g):
    return lax.psum_scatter(g, "fsdp", scatter_dimension=g.ndim - 1, tiled=True)


def _cols_local(p, mom, x, y, reduce):
    full = tm(lambda a: lax.all_gather(a, "fsdp", axis=a.ndim - 1, tiled=True), p)
    g = jax.grad(_loss)(full, x, y)
    g = tm(reduce, g)
    return _sgd(p, mom, g)


def _cols(p, mom, x, y, mesh, reduce):
    spec = tm(_last, p)
    batch = P(("dp", "fsdp"))
    return jax.shard_map(lambda *a: _cols_local(*a, reduce), mesh=mesh, in_specs=(spec, spec, batch, batch),
                         out_specs=(spec, spec), check_vma=False)(p, mom, x, y)


def hsdp_cols(params, mom, x, y, mesh):
    return _cols(params, mom, x, y, mesh, lambda g: lax.pmean(_scatter_cols(g) / 2, "dp"))


def hsdp_cols_no_dp_mean(params, mom, x, y, mesh):
    return _cols(params, mom, x, y, mesh, lambda g: _scatter_cols(g) / 2)
