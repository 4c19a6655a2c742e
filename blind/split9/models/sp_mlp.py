"""Megatron sequence-parallel MLP sublayer: RMSNorm on sequence shards, all-gather the sequence,
column/row-parallel MLP, reduce-scatter back to sequence shards, residual.

Style: NamedTuple params, explicit collectives, norm weight stored as an offset from 1.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


class MlpParams(NamedTuple):
    norm_w: jax.Array  # RMSNorm weight stored as (scale - 1)
    w_in: jax.Array
    b_in: jax.Array
    w_out: jax.Array


def specs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(2, 8, 16), MlpParams(f(16), f(16, 64), f(64), f(64, 16))


def rms_norm(x, w_offset, eps=1e-6):
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + eps) * (1.0 + w_offset)


def mlp_sublayer(x, p: MlpParams):
    h = rms_norm(x, p.norm_w)
    h = jax.nn.gelu(h @ p.w_in + p.b_in, approximate=True)
    return x + h @ p.w_out


def _sp_body(x_blk, p: MlpParams):
    h = rms_norm(x_blk, p.norm_w)
    h = jax.lax.all_gather(h, "tp", axis=1, tiled=True)  # [b, s, d]
    h = jax.nn.gelu(h @ p.w_in + p.b_in, approximate=True)
    y = jax.lax.psum_scatter(h @ p.w_out, "tp", scatter_dimension=1, tiled=True)
    return x_blk + y


def _sp_body_fused(x_blk, p: MlpParams):
    h = jax.lax.all_gather(rms_norm(x_blk, p.norm_w), "tp", axis=1, tiled=True)
    h = jax.nn.gelu(h @ p.w_in + p.b_in, approximate=True)
    out = jax.lax.psum_scatter(h @ p.w_out, "tp", scatter_dimension=1, tiled=True)
    return out


_PSPEC = MlpParams(P(), P(None, "tp"), P("tp"), P("tp", None))


def mlp_sublayer_sp(x, p, mesh):
    return jax.shard_map(_sp_body, mesh=mesh, in_specs=(P(None, "tp"), _PSPEC),
                         out_specs=P(None, "tp"))(x, p)


def mlp_sublayer_sp_fused(x, p, mesh):
    return jax.shard_map(_sp_body_fused, mesh=mesh, in_specs=(P(None, "tp"), _PSPEC),
                         out_specs=P(None, "tp"))(x, p)
