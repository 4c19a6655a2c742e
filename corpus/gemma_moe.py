"""Entrypoints around Google DeepMind's Gemma 4 mixture-of-experts layer (gemma.gm.nn.gemma4._moe).

`MoE` routes each token to its top-2 of 4 experts (softmax router, argsort dispatch, masked
dense expert FFNs, reverse-argsort collect); `MoERagged` is the library's ragged_dot version of
the same function with the same parameters. Distributed forms: data parallel over token groups
with shard_map (experts replicated), the expert FFN hidden dimension split over `tp` with a psum
(Megatron inside every expert), and expert-sharded weights placed by jit alone.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from gemma.gm.nn.gemma4 import _moe
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

GROUPS, TOKENS, FEATURES, HIDDEN, EXPERTS, TOP_K = 4, 8, 32, 64, 4, 2


def _layer(kind=_moe.MoE, hidden=HIDDEN):
    return kind(features=FEATURES, hidden_dim=hidden, num_experts=EXPERTS, num_experts_per_datapoint=TOP_K)


def inputs():
    x = jax.ShapeDtypeStruct((GROUPS, TOKENS, FEATURES), jnp.float32)
    params = jax.eval_shape(lambda: _layer().init(jax.random.key(0), jnp.zeros(x.shape, x.dtype)))
    return params, x


def reference(params, x):
    return _layer().apply(params, x)


# Parameter layouts: expert FFN weights are [E, 2, H, F] (gate and up) and [E, H, F] (down).
REPLICATED = {"params": {"router_logits": {"w": P()}, "gating_einsum": {"w": P()}, "linear": {"w": P()},
                         "per_expert_scale": P(), "router_scale": P()}}
HIDDEN_SPLIT = {"params": {"router_logits": {"w": P()}, "gating_einsum": {"w": P(None, None, "tp", None)},
                           "linear": {"w": P(None, "tp", None)}, "per_expert_scale": P(), "router_scale": P()}}


def _data_parallel(params, x, mesh, kind=_moe.MoE):
    return jax.shard_map(lambda p, xs: _layer(kind).apply(p, xs), mesh=mesh,
                         in_specs=(REPLICATED, P("dp")), out_specs=P("dp"))(params, x)


def dp(params, x, *, mesh):
    return _data_parallel(params, x, mesh)


def dp_ragged(params, x, *, mesh):
    """The library's ragged_dot implementation, data parallel, against the dense reference."""
    return _data_parallel(params, x, mesh, kind=_moe.MoERagged)


@contextlib.contextmanager
def _patched(module, name, replacement):
    """Replace module.name while the distributed entrypoint traces; the library file is untouched."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield original
    finally:
        setattr(module, name, original)


_ORIGINAL_COLLECT = _moe._expert_collect


def _collect_with_global_order(sorted_xs, xs_reverse_argsort, xs_combine_weights):
    # A port of global-batch dispatch into shard_map that keeps the global token numbering.
    groups, tokens, _ = xs_combine_weights.shape
    offset = lax.axis_index("dp") * groups * tokens
    return _ORIGINAL_COLLECT(sorted_xs, xs_reverse_argsort + offset, xs_combine_weights)  # BUG: un-sorts local tokens with the global token offset: on shard i > 0 the gather reads past the local tokens (clamped)


def dp_collect_global_offset(params, x, *, mesh):
    with _patched(_moe, "_expert_collect", _collect_with_global_order):
        return _data_parallel(params, x, mesh)


def _hidden_parallel(params, x, mesh, reduce_axis):
    def body(p, xs):
        local = _layer(hidden=HIDDEN // lax.axis_size("tp")).apply(p, xs)  # a partial sum over tp
        return lax.psum(local, reduce_axis)

    return jax.shard_map(body, mesh=mesh, in_specs=(HIDDEN_SPLIT, P("dp")), out_specs=P("dp"),
                         check_vma=False)(params, x)


def dp_tp(params, x, *, mesh):
    return _hidden_parallel(params, x, mesh, "tp")


def dp_tp_reduce_over_dp(params, x, *, mesh):
    return _hidden_parallel(params, x, mesh, "dp")  # BUG: the expert partial sums are reduced over dp (other token groups) instead of tp


EXPERT_SHARDED = {"params": {"router_logits": {"w": P()}, "gating_einsum": {"w": P("ep")},
                             "linear": {"w": P("ep")}, "per_expert_scale": P("ep"), "router_scale": P()}}


def ep_jit(params, x, *, mesh):
    """Experts sharded over `ep`, token groups over `dp`, by sharding constraints only."""
    params = jax.tree.map(lambda a, s: lax.with_sharding_constraint(a, NamedSharding(mesh, s)), params, EXPERT_SHARDED)
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp")))
    return lax.with_sharding_constraint(_layer().apply(params, x), NamedSharding(mesh, P("dp")))
