"""Regression MLP whose parameters live as flat 1-D buffers (ZeRO-3 layout).

The reference unflattens and runs on one device; the sharded loss keeps each buffer split over
'fsdp' and the batch split over the same axis.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D_IN, D_HID = 16, 32
BATCH = 8


def param_shapes():
    return {
        "w_in": jax.ShapeDtypeStruct((D_IN * D_HID,), jnp.float32),
        "b_in": jax.ShapeDtypeStruct((D_HID,), jnp.float32),
        "w_out": jax.ShapeDtypeStruct((D_HID * D_IN,), jnp.float32),
    }


def inputs():
    x = jax.ShapeDtypeStruct((BATCH, D_IN), jnp.float32)
    y = jax.ShapeDtypeStruct((BATCH, D_IN), jnp.float32)
    return param_shapes(), x, y


def _unflatten(flat):
    return (flat["w_in"].reshape(D_IN, D_HID), flat["b_in"],
            flat["w_out"].reshape(D_HID, D_IN))


def mse_loss(flat, x, y):
    w_in, b_in, w_out = _unflatten(flat)
    hidden = jax.nn.gelu(x @ w_in + b_in)
    return jnp.mean(jnp.square(hidden @ w_out - y))


def _gather_all(flat_shards):
    return {name: lax.all_gather(buf, "fsdp", tiled=True) for name, buf in flat_shards.items()}


def zero3_loss(flat, x, y, mesh):
    specs = {name: P("fsdp") for name in flat}

    def per_device(flat_shards, xb, yb):
        local = mse_loss(_gather_all(flat_shards), xb, yb)
        return lax.pmean(local, "fsdp")

    fn = jax.shard_map(per_device, mesh=mesh, in_specs=(specs, P("fsdp"), P("fsdp")),
                       out_specs=P())
    return fn(flat, x, y)


def zero3_loss_v2(flat, x, y, mesh):
    specs = {name: P("fsdp") for name in flat}

    def per_device(flat_shards, xb, yb):
        local = mse_loss(_gather_all(flat_shards), xb, yb)
        return lax.psum(local, "fsdp")

    fn = jax.shard_map(per_device, mesh=mesh, in_specs=(specs, P("fsdp"), P("fsdp")),
                       out_specs=P())
    return fn(flat, x, y)
