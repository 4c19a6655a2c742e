# Rotary embedding (rotate-half convention) with cos/sin tables precomputed once in numpy for the
# maximum length; heads are sharded over 'tp' and the sequence over 'sp', so each device slices
# the table rows of its sequence block.
import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, H, HD, MAX_LEN = 2, 8, 4, 8, 32

_inv = 1.0 / (10000.0 ** (np.arange(0, HD, 2) / HD))
_ang = np.outer(np.arange(MAX_LEN), _inv)
COS = np.concatenate([np.cos(_ang)] * 2, axis=-1).astype(np.float32)  # [MAX_LEN, HD]
SIN = np.concatenate([np.sin(_ang)] * 2, axis=-1).astype(np.float32)


def example():
    return (jax.ShapeDtypeStruct((B, S, H, HD), jnp.float32),)


def _rot_half(x):
    a, b = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-b, a], axis=-1)


def apply_rope(x):
    cos, sin = jnp.asarray(COS[:S]), jnp.asarray(SIN[:S])
    return x * cos[None, :, None, :] + _rot_half(x) * sin[None, :, None, :]


def apply_rope_sharded(x, mesh):
    def rope_block(xb):
        blk = xb.shape[1]
        start = lax.axis_index("sp") * blk
        cos = lax.dynamic_slice_in_dim(jnp.asarray(COS), start, blk)
        sin = lax.dynamic_slice_in_dim(jnp.asarray(SIN), start, blk)
        return xb * cos[None, :, None, :] + _rot_half(xb) * sin[None, :, None, :]

    spec = P(None, "sp", "tp", None)
    return jax.shard_map(rope_block, mesh=mesh, in_specs=spec, out_specs=spec)(x)


def apply_rope_sharded_no_offset(x, mesh):
    def rope_block(xb):
        blk = xb.shape[1]
        cos = jnp.asarray(COS[:blk])
        sin = jnp.asarray(SIN[:blk])
        return xb * cos[None, :, None, :] + _rot_half(xb) * sin[None, :, None, :]

    spec = P(None, "sp", "tp", None)
    return jax.shard_map(rope_block, mesh=mesh, in_specs=spec, out_specs=spec)(x)
