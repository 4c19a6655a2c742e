"""ZeRO-3 style stack of gated residual MLP layers stored as flat 1-D buffers, applied with lax.scan."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_LAYERS, D_MODEL, D_FF, BATCH = 3, 8, 16, 8


class FlatStack(NamedTuple):
    w_in: jax.Array   # [layers, D_MODEL * D_FF], a row-major (D_MODEL, D_FF) matrix per layer
    w_out: jax.Array  # [layers, D_FF * D_MODEL], a row-major (D_FF, D_MODEL) matrix per layer
    gain: jax.Array   # [layers, D_MODEL]


def _block(h, w_in, w_out, gain):
    z = jax.nn.silu((h * gain) @ w_in)
    return h + z @ w_out


def stack_forward(stack: FlatStack, x):
    def step(h, layer):
        w_in = layer.w_in.reshape(D_MODEL, D_FF)
        w_out = layer.w_out.reshape(D_FF, D_MODEL)
        return _block(h, w_in, w_out, layer.gain), None

    out, _ = lax.scan(step, x, stack)
    return out


def _make_sharded(unflatten_out):
    def local(stack, x):
        def step(h, layer):
            w_in = lax.all_gather(layer.w_in, "fsdp", tiled=True).reshape(D_MODEL, D_FF)
            w_out = unflatten_out(lax.all_gather(layer.w_out, "fsdp", tiled=True))
            return _block(h, w_in, w_out, layer.gain), None

        out, _ = lax.scan(step, x, stack)
        return out

    specs = FlatStack(w_in=P(None, "fsdp"), w_out=P(None, "fsdp"), gain=P())
    return jax.shard_map(local, in_specs=(specs, P("fsdp")), out_specs=P("fsdp"), check_vma=False)


def stack_forward_zero3(stack: FlatStack, x):
    return _make_sharded(lambda flat: flat.reshape(D_FF, D_MODEL))(stack, x)


def stack_forward_zero3_wout_layout(stack: FlatStack, x):
    return _make_sharded(lambda flat: flat.reshape(D_MODEL, D_FF).T)(stack, x)


def example_args():
    f32 = jnp.float32
    stack = FlatStack(
        w_in=jax.ShapeDtypeStruct((N_LAYERS, D_MODEL * D_FF), f32),
        w_out=jax.ShapeDtypeStruct((N_LAYERS, D_FF * D_MODEL), f32),
        gain=jax.ShapeDtypeStruct((N_LAYERS, D_MODEL), f32),
    )
    return stack, jax.ShapeDtypeStruct((BATCH, D_MODEL), f32)
