"""ZeRO-3 MLP block: each parameter is stored as a flat 1-D buffer and sharded over 'fsdp'."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D_MODEL, D_HIDDEN, BATCH = 16, 32, 8


class FlatParams(NamedTuple):
    w_in: jax.Array   # [D_MODEL * D_HIDDEN], row-major [D_MODEL, D_HIDDEN]
    b_in: jax.Array   # [D_HIDDEN]
    w_out: jax.Array  # [D_HIDDEN * D_MODEL], row-major [D_HIDDEN, D_MODEL]
    gamma: jax.Array  # [D_MODEL]


def param_shapes():
    sd = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    params = FlatParams(sd(D_MODEL * D_HIDDEN), sd(D_HIDDEN), sd(D_HIDDEN * D_MODEL), sd(D_MODEL))
    return params, sd(BATCH, D_MODEL)


def _layer_norm(x, gamma, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * gamma


def block(params: FlatParams, x):
    h = _layer_norm(x, params.gamma)
    h = jax.nn.gelu(h @ params.w_in.reshape(D_MODEL, D_HIDDEN) + params.b_in)
    return x + h @ params.w_out.reshape(D_HIDDEN, D_MODEL)


def block_zero3(params: FlatParams, x, mesh):
    flat_spec = FlatParams(P("fsdp"), P("fsdp"), P("fsdp"), P("fsdp"))

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(flat_spec, P("fsdp")),
                       out_specs=P("fsdp"))
    def run(local, x_local):
        full = FlatParams(*[lax.all_gather(buf, "fsdp", tiled=True) for buf in local])
        return block(full, x_local)

    return run(params, x)
