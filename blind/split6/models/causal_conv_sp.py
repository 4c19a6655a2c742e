"""Gated causal depthwise convolution (Mamba/Hyena-style short conv) with the sequence sharded.

Each sequence shard needs the last KERNEL-1 positions of the previous shard (a halo), passed with
ppermute; the first shard pads with zeros like the reference.
"""
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

KERNEL, BATCH, SEQ, CH = 3, 2, 16, 8
SP = 4


def short_conv(x, taps, gate_w):
    """x [B,S,C]; taps [K,C]; gate_w [C,C]."""
    seq = x.shape[1]
    padded = jnp.pad(x, ((0, 0), (KERNEL - 1, 0), (0, 0)))
    y = sum(padded[:, j:j + seq, :] * taps[j] for j in range(KERNEL))
    return y * jax.nn.sigmoid(x @ gate_w)


def _halo_conv(x_local, taps, gate_w, perm):
    halo = lax.ppermute(x_local[:, -(KERNEL - 1):, :], "sp", perm=perm)
    seq = x_local.shape[1]
    padded = jnp.concatenate([halo, x_local], axis=1)
    y = sum(padded[:, j:j + seq, :] * taps[j] for j in range(KERNEL))
    return y * jax.nn.sigmoid(x_local @ gate_w)


@partial(jax.shard_map, in_specs=(P(None, "sp"), P(), P()), out_specs=P(None, "sp"))
def short_conv_sp(x, taps, gate_w):
    to_next = [(i, i + 1) for i in range(SP - 1)]
    return _halo_conv(x, taps, gate_w, to_next)


@partial(jax.shard_map, in_specs=(P(None, "sp"), P(), P()), out_specs=P(None, "sp"))
def short_conv_sp_from_next(x, taps, gate_w):
    to_next = [(i + 1, i) for i in range(SP - 1)]
    return _halo_conv(x, taps, gate_w, to_next)


def arg_specs():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, CH), jnp.float32),
            jax.ShapeDtypeStruct((KERNEL, CH), jnp.float32),
            jax.ShapeDtypeStruct((CH, CH), jnp.float32))
