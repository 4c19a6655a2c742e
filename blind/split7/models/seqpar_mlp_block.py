# Sequence-parallel pre-norm MLP block (Megatron-SP): activations are split over the sequence
# between blocks and gathered only around the tensor-parallel matmuls.
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BS, SEQ, HID, FFN = 2, 8, 16, 32
EPS = 1e-6


def block_inputs():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BS, SEQ, HID), f32),
            jax.ShapeDtypeStruct((HID,), f32),
            jax.ShapeDtypeStruct((HID, FFN), f32),
            jax.ShapeDtypeStruct((FFN, HID), f32))


def rmsnorm_offset(x, scale):
    """Gemma-style RMSNorm: the learned scale is stored as an offset from 1."""
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * lax.rsqrt(ms + EPS) * (1.0 + scale)


def mlp_block(x, scale, w_up, w_down):
    h = rmsnorm_offset(x, scale)
    return x + jax.nn.gelu(h @ w_up, approximate=True) @ w_down


SPECS = dict(in_specs=(P(None, "tp", None), P(), P(None, "tp"), P("tp", None)),
             out_specs=P(None, "tp", None))


def mlp_block_sp(x, scale, w_up, w_down, mesh):
    @functools.partial(jax.shard_map, mesh=mesh, **SPECS)
    def run(x_seq, scale, up_cols, down_rows):
        h = rmsnorm_offset(x_seq, scale)
        h = lax.all_gather(h, "tp", axis=1, tiled=True)
        partial = jax.nn.gelu(h @ up_cols, approximate=True) @ down_rows
        out = lax.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)
        return x_seq + out

    return run(x, scale, w_up, w_down)


def mlp_block_sp_fused(x, scale, w_up, w_down, mesh):
    @functools.partial(jax.shard_map, mesh=mesh, **SPECS)
    def run(x_seq, scale, up_cols, down_rows):
        h = rmsnorm_offset(x_seq, scale)
        h = lax.all_gather(h, "tp", axis=1, tiled=True)
        partial = jax.nn.gelu(h @ up_cols, approximate=True) @ down_rows
        return lax.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)

    return run(x, scale, w_up, w_down)
