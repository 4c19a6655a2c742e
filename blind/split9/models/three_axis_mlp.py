"""Two-layer residual GELU MLP on an 8-device (data, fsdp, tensor) mesh, sharded with jit and
with_sharding_constraint only (no shard_map): weights are 2-D sharded over (fsdp, tensor), the
batch over (data, fsdp). Einsums with ellipses.
"""
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

B, S, D = 8, 4, 16


def arg_shapes():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(B, S, D), f(D, D), f(D, D)


def residual_mlp(x, w_up, w_down):
    return x + jax.nn.gelu(x @ w_up) @ w_down


def _c(mesh, t, *spec):
    return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P(*spec)))


def _sharded(x, w_up, w_down, mesh, down_proj):
    c = functools.partial(_c, mesh)
    x = c(x, ("data", "fsdp"), None, None)
    w_up, w_down = c(w_up, "fsdp", "tensor"), c(w_down, "tensor", "fsdp")
    h = c(jax.nn.gelu(jnp.einsum("...d,df->...f", x, w_up)), ("data", "fsdp"), None, "tensor")
    y = c(down_proj(h, w_down), ("data", "fsdp"), None, None)
    return x + y


def residual_mlp_3d(x, w_up, w_down, mesh):
    return _sharded(x, w_up, w_down, mesh, lambda h, w: jnp.einsum("...f,fd->...d", h, w))


def residual_mlp_3d_v2(x, w_up, w_down, mesh):
    return _sharded(x, w_up, w_down, mesh, lambda h, w: jnp.einsum("...f,df->...d", h, w))
