"""Adversarial variants for the soundness sweep (bench/mutants.py --probes, tests/bench/test_mutants.py).

Each differs from its reference over the reals in a way random inputs do not show: a change
inside the oracle's tolerance, one that depends on values random inputs never take, or one on
integer inputs the oracle does not draw (it draws ids below the smallest float dimension). The
numeric oracle calls them equal, so the sweep's mutants cannot stand in for them; equivci must
still never say `verified`. The loop models put a bug in one iteration or one device only.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import fsdp
import norms
import vocab_parallel as vp
from common import spec

TP = "tp"


def xent_high_labels_moved(logits, labels, *, mesh):
    """Labels >= 16 (vocab shards 2 and 3) scored as label 0; the oracle draws labels in [0, 16)."""
    return vp.cross_entropy_tp(logits, jnp.where(labels >= 16, 0, labels), mesh=mesh)


def xent_clip_logits(logits, labels, *, mesh):
    """Logits clipped at -1e30, not -inf: differs only below -1e30."""
    return vp.cross_entropy_tp(jnp.maximum(logits, -1e30), labels, mesh=mesh)


def rms_eps_doubled(x, gamma, *, mesh):
    """eps doubled: a relative change near 1e-6, inside the float32 tolerance."""
    width = x.shape[-1]

    def body(x, gamma):
        ms = lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), TP) / width
        return x * lax.rsqrt(ms + 2 * norms.EPS_RMS) * gamma

    return jax.shard_map(body, mesh=mesh, in_specs=(norms.HIDDEN, P(TP)), out_specs=norms.HIDDEN)(x, gamma)


def fsdp_zero_large(x, w1, w2, *, mesh):
    """Inputs above 100 zeroed: never on standard normal inputs."""
    return fsdp.mlp_fsdp(jnp.where(x > 100.0, 0.0, x), w1, w2, mesh=mesh)


def fsdp_point_change(x, w1, w2, *, mesh):
    """One float value mapped to another: probability zero under random inputs."""
    return fsdp.mlp_fsdp(jnp.where(x == 0.5, 0.25, x), w1, w2, mesh=mesh)


# A loop over stacked weights, data-parallel over the rows: fori_loop becomes an HLO while, which
# equivci proves once as an invariant; these bugs live in one iteration or on one device.
L, B, D = 3, 8, 16


def loop(x, ws):
    return lax.fori_loop(0, L, lambda i, h: jnp.tanh(h @ ws[i]), x)


def loop_inputs():
    return (spec(B, D), spec(L, D, D))


def _loop_dp(step, x, ws, mesh, trips=L):
    def body(x, ws):
        return lax.fori_loop(0, trips, lambda i, h: step(i, h, ws), x)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP), P()), out_specs=P(TP))(x, ws)


def loop_dp(x, ws, *, mesh):
    return _loop_dp(lambda i, h, ws: jnp.tanh(h @ ws[i]), x, ws, mesh)


def loop_dp_last_weight_repeated(x, ws, *, mesh):
    return _loop_dp(lambda i, h, ws: jnp.tanh(h @ ws[jnp.minimum(i, L - 2)]), x, ws, mesh)


def loop_dp_one_trip_short(x, ws, *, mesh):
    return _loop_dp(lambda i, h, ws: jnp.tanh(h @ ws[i]), x, ws, mesh, trips=L - 1)


def loop_dp_tiny_last_trip(x, ws, *, mesh):
    return _loop_dp(lambda i, h, ws: jnp.tanh(h @ ws[i]) * jnp.where(i == L - 1, 1.0 + 1e-6, 1.0), x, ws, mesh)


def loop_dp_first_trip_skipped_on_device1(x, ws, *, mesh):
    def step(i, h, ws):
        return jnp.where((i == 0) & (lax.axis_index(TP) == 1), h, jnp.tanh(h @ ws[i]))

    return _loop_dp(step, x, ws, mesh)
