"""Weight-only int8 linear layer with per-output-channel scales, column-parallel over `tp`;
the scales stay replicated and each shard picks its channels. Output all-gathered.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

D, F = 16, 32


def qargs():
    return (jax.ShapeDtypeStruct((6, D), jnp.float32),
            jax.ShapeDtypeStruct((D, F), jnp.int8),
            jax.ShapeDtypeStruct((F,), jnp.float32))


def qlinear(x, w_q, scale):
    return jnp.matmul(x, w_q.astype(jnp.float32)) * scale[None, :]


def _my_scales(scale, width):
    return jax.lax.dynamic_slice_in_dim(scale, jax.lax.axis_index("tp") * width, width)


def _my_scales_v2(scale, width):
    return jax.lax.dynamic_slice_in_dim(scale, jax.lax.axis_index("tp"), width)


def _col_block(x, w_q, scale, pick_scales=_my_scales):
    width = w_q.shape[1]
    s = pick_scales(scale, width)
    y = jnp.matmul(x, w_q.astype(jnp.float32)) * s
    return jax.lax.all_gather(y, "tp", axis=1, tiled=True)


def qlinear_tp(x, w_q, scale, mesh):
    return jax.shard_map(_col_block, mesh=mesh, in_specs=(P(), P(None, "tp"), P()),
                         out_specs=P(), check_vma=False)(x, w_q, scale)


def qlinear_tp_v2(x, w_q, scale, mesh):
    body = lambda x, w_q, scale: _col_block(x, w_q, scale, _my_scales_v2)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P()),
                         out_specs=P(), check_vma=False)(x, w_q, scale)
