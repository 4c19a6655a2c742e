"""Transformer MLP (square up/down projections) sharded by jit alone: the weights and the hidden
activations carry sharding constraints, XLA's partitioner inserts the collectives."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D = 2, 4, 16


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((D, D), f),
            jax.ShapeDtypeStruct((D, D), f), jax.ShapeDtypeStruct((D,), f))


def mlp(x, w_up, w_down, bias):
    h = jnp.einsum("bsd,df->bsf", x, w_up)
    h = jax.nn.relu(h + bias)
    return jnp.einsum("bsf,fd->bsd", h, w_down)


def _c(mesh, t, *spec):
    return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P(*spec)))


def mlp_auto(x, w_up, w_down, bias, mesh):
    w_up, w_down, bias = _c(mesh, w_up, None, "tp"), _c(mesh, w_down, "tp", None), _c(mesh, bias, "tp")
    x = _c(mesh, x, "dp", None, None)
    h = _c(mesh, jnp.einsum("bsd,df->bsf", x, w_up), "dp", None, "tp")
    h = jax.nn.relu(h + bias)
    return _c(mesh, jnp.einsum("bsf,fd->bsd", h, w_down), "dp", None, None)


def mlp_auto_einsum(x, w_up, w_down, bias, mesh):
    w_up, w_down, bias = _c(mesh, w_up, None, "tp"), _c(mesh, w_down, "tp", None), _c(mesh, bias, "tp")
    x = _c(mesh, x, "dp", None, None)
    h = _c(mesh, jnp.einsum("bsd,df->bsf", x, w_up), "dp", None, "tp")
    h = jax.nn.relu(h + bias)
    return _c(mesh, jnp.einsum("bsf,df->bsd", h, w_down), "dp", None, None)
