"""RMSNorm and LayerNorm over a hidden dimension that is sharded across `tp`.

The statistics are sums over the hidden dimension, so each shard reduces its slice and the
partial sums are psum'd; dividing by the global width gives the reference mean.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import layer_norm, rms_norm, spec

B, S, D = 2, 8, 32
EPS_RMS, EPS_LN = 1e-6, 1e-5
TP = "tp"
HIDDEN = P(None, None, TP)


def rms_inputs():
    return (spec(B, S, D), spec(D))


def ln_inputs():
    return (spec(B, S, D), spec(D), spec(D))


def rms_norm_tp(x, gamma, *, mesh):
    width = x.shape[-1]  # global hidden size

    def body(x, gamma):
        ms = lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), TP) / width
        return x * lax.rsqrt(ms + EPS_RMS) * gamma

    return jax.shard_map(body, mesh=mesh, in_specs=(HIDDEN, P(TP)), out_specs=HIDDEN)(x, gamma)


def rms_norm_tp_local_stats(x, gamma, *, mesh):
    def body(x, gamma):
        ms = jnp.mean(x * x, axis=-1, keepdims=True)  # BUG: mean over the local slice only; needs a psum over tp
        return x * lax.rsqrt(ms + EPS_RMS) * gamma

    return jax.shard_map(body, mesh=mesh, in_specs=(HIDDEN, P(TP)), out_specs=HIDDEN)(x, gamma)


def layer_norm_tp(x, gamma, beta, *, mesh):
    width = x.shape[-1]

    def body(x, gamma, beta):
        mean = lax.psum(jnp.sum(x, axis=-1, keepdims=True), TP) / width
        var = lax.psum(jnp.sum((x - mean) ** 2, axis=-1, keepdims=True), TP) / width
        return (x - mean) * lax.rsqrt(var + EPS_LN) * gamma + beta

    return jax.shard_map(
        body, mesh=mesh, in_specs=(HIDDEN, P(TP), P(TP)), out_specs=HIDDEN,
    )(x, gamma, beta)


def layer_norm_tp_local_width(x, gamma, beta, *, mesh):
    def body(x, gamma, beta):
        width = x.shape[-1]  # BUG: the local slice width (D / tp), not the global hidden size
        mean = lax.psum(jnp.sum(x, axis=-1, keepdims=True), TP) / width
        var = lax.psum(jnp.sum((x - mean) ** 2, axis=-1, keepdims=True), TP) / width
        return (x - mean) * lax.rsqrt(var + EPS_LN) * gamma + beta

    return jax.shard_map(
        body, mesh=mesh, in_specs=(HIDDEN, P(TP), P(TP)), out_specs=HIDDEN,
    )(x, gamma, beta)
