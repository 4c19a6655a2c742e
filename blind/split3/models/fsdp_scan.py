"""Stacked residual layers under lax.scan; FSDP shards every layer's weight rows across devices."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_LAYERS, WIDTH, TOKENS = 3, 16, 8


class Stack(NamedTuple):
    kernel: jax.Array  # [layers, width, width]
    scale: jax.Array  # [layers, width]


def _layer(h, kernel, scale):
    normed = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * scale
    return h + jnp.tanh(jnp.dot(normed, kernel))


def run_stack(stack, h):
    def step(carry, layer):
        kernel, scale = layer
        return _layer(carry, kernel, scale), None

    out, _ = lax.scan(step, h, (stack.kernel, stack.scale))
    return out


def stack_inputs():
    f32 = jnp.float32
    stack = Stack(
        kernel=jax.ShapeDtypeStruct((N_LAYERS, WIDTH, WIDTH), f32),
        scale=jax.ShapeDtypeStruct((N_LAYERS, WIDTH), f32),
    )
    return stack, jax.ShapeDtypeStruct((TOKENS, WIDTH), f32)


def run_stack_fsdp(stack, h, mesh):
    axis = mesh.axis_names[0]

    def per_device(st, hs):
        def step(carry, layer):
            kernel_rows, scale = layer
            kernel = lax.all_gather(kernel_rows, axis, axis=0, tiled=True)
            return _layer(carry, kernel, scale), None

        out, _ = lax.scan(step, hs, (st.kernel, st.scale))
        return out

    spec = Stack(kernel=P(None, axis, None), scale=P())
    return jax.shard_map(per_device, mesh=mesh, in_specs=(spec, P(axis)), out_specs=P(axis))(stack, h)
