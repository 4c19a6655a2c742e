"""Residual GELU MLP, trained with fully-sharded data parallelism.

Each device keeps 1/N of every weight (flattened, like a flat-param FSDP wrapper) and the matching
slice of the batch; weights are all-gathered and reshaped right before use.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

D_MODEL, D_FF, BATCH, SEQ = 32, 64, 8, 4


def mlp(params, x):
    h = jax.nn.gelu(x @ params["w_in"])
    return x + h @ params["w_out"]


def mlp_inputs():
    f32 = jnp.float32
    params = {"w_in": jax.ShapeDtypeStruct((D_MODEL, D_FF), f32),
              "w_out": jax.ShapeDtypeStruct((D_FF, D_MODEL), f32)}
    return params, jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), f32)


def _unflatten(flat_shard, shape, axis_name):
    return lax.all_gather(flat_shard, axis_name, tiled=True).reshape(shape)


def mlp_fsdp(params, x, mesh):
    shapes = {k: v.shape for k, v in params.items()}
    flat = {k: v.reshape(-1) for k, v in params.items()}

    @jax.shard_map(mesh=mesh, in_specs=(P("fsdp"), P("fsdp")), out_specs=P("fsdp"))
    def step(flat, x):
        w_in = _unflatten(flat["w_in"], shapes["w_in"], "fsdp")
        w_out = _unflatten(flat["w_out"], shapes["w_out"], "fsdp")
        return mlp({"w_in": w_in, "w_out": w_out}, x)

    return step(flat, x)


def mlp_fsdp_rowsharded(params, x, mesh):
    """Weights sharded along their first dimension instead of flattened."""

    def body(w_in, w_out, x):
        w_in = lax.all_gather(w_in, "fsdp", axis=0, tiled=True)
        w_out = lax.all_gather(w_out, "fsdp", axis=1, tiled=True).reshape(D_FF, D_MODEL)
        h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", x, w_in))
        return x + jnp.einsum("bsf,fd->bsd", h, w_out)

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P("fsdp", None), P("fsdp", None), P("fsdp")),
                       out_specs=P("fsdp"))
    return fn(params["w_in"], params["w_out"], x)


class Weights(NamedTuple):
    w_in: jax.Array
    w_out: jax.Array


def mlp_2d_inputs():
    params, x = mlp_inputs()
    return Weights(params["w_in"], params["w_out"]), x


def mlp_2d(weights: Weights, x):
    return mlp(weights._asdict(), x)


def mlp_fsdp_tp(weights: Weights, x, mesh):
    """FSDP over `fsdp` (batch and the weights' non-TP dimension) plus Megatron TP over `tp`."""

    def body(w: Weights, xb):
        w_in = lax.all_gather(w.w_in, "fsdp", axis=0, tiled=True)    # [d, ff/tp]
        w_out = lax.all_gather(w.w_out, "fsdp", axis=1, tiled=True)  # [ff/tp, d]
        h = jax.nn.gelu(lax.dot_general(xb, w_in, (((2,), (0,)), ((), ()))))
        partial = lax.dot_general(h, w_out, (((2,), (0,)), ((), ())))
        return xb + lax.psum(partial, "tp")

    specs = Weights(w_in=P("fsdp", "tp"), w_out=P("tp", "fsdp"))
    fn = shard_map(body, mesh, in_specs=(specs, P("fsdp", None, None)),
                   out_specs=P("fsdp", None, None), check_rep=False)
    return fn(weights, x)
