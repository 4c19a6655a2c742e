"""Entrypoints around penzai's Llama-like transformer: dense (4 heads) and GQA (2 KV groups x 2).

Tensor parallelism the Megatron way with shard_map: attention heads (or KV head groups) and
MLP neurons are split over `tp`, an AllReduce layer is inserted after the attention output and
MLP output projections with penzai's selector API, the batch may be split over `dp`, and the
LM head may be vocabulary-parallel (logits returned sharded over `tp`). A jit-only variant
places the same shardings with penzai's sharding_util and lets XLA partition.
"""

from __future__ import annotations

import jax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from penzai import pz
from penzai.toolshed import sharding_util
from penzai_model import (
    DENSE,
    GQA,
    axis_position,
    forward,
    reduce_after,
    skeleton,
    token_spec,
    weight_specs,
)

ROW_PARALLEL = ("attention/output.weights", "mlp/out_linear.weights")
TP_AXES = {"heads": "tp", "head_groups": "tp", "neurons": "tp"}
LM_HEAD = "transformer/lm_head.weights"


def _specs(cfg, rules: dict[str, str], vocab_parallel_head: bool = False) -> dict[str, P]:
    specs = {}
    for label, named in skeleton(cfg)[1].items():
        rule = dict(rules, vocabulary="tp") if vocab_parallel_head and label == LM_HEAD else rules
        specs[label] = P(*(rule.get(axis) for axis in named))
    return specs


def _tensor_parallel(cfg, weights, tokens, mesh, *, batch_axis=None, reduce_axis="tp",
                     reduced=ROW_PARALLEL, vocab_parallel_head=False, weight_specs_=None, local_weights=None):
    specs = weight_specs_ or _specs(cfg, TP_AXES, vocab_parallel_head)
    out_spec = P(batch_axis, None, "tp" if vocab_parallel_head else None)

    def body(w, t):
        if local_weights is not None:
            w = local_weights(w)
        return forward(cfg, w, t, edit=reduce_after(reduced, reduce_axis))

    # check_vma=False, as much production shard_map code runs: replication is the author's claim,
    # not something JAX checks (this is what lets a missing reduce trace at all).
    return jax.shard_map(body, mesh=mesh, in_specs=(specs, P(batch_axis, None)), out_specs=out_spec,
                         check_vma=False)(weights, tokens)


# ---- dense Llama (multi-head attention) -------------------------------------------------------

def inputs_dense():
    return (weight_specs(DENSE), token_spec())


def reference_dense(weights, tokens):
    return forward(DENSE, weights, tokens)


def tp_dense(weights, tokens, *, mesh):
    return _tensor_parallel(DENSE, weights, tokens, mesh)


def tp_dense_missing_mlp_psum(weights, tokens, *, mesh):
    return _tensor_parallel(DENSE, weights, tokens, mesh, reduced=("attention/output.weights",))  # BUG: no AllReduce after mlp/out_linear: the MLP output stays a per-shard partial sum


def dp_tp_dense(weights, tokens, *, mesh):
    return _tensor_parallel(DENSE, weights, tokens, mesh, batch_axis="dp", vocab_parallel_head=True)


def dp_tp_dense_reduce_over_dp(weights, tokens, *, mesh):
    return _tensor_parallel(DENSE, weights, tokens, mesh, batch_axis="dp", vocab_parallel_head=True, reduce_axis="dp")  # BUG: the row-parallel AllReduce sums over dp (other sequences) instead of tp


def jit_dense(weights, tokens, *, mesh):
    """No shard_map: penzai's sharding_util names the shardings (heads and neurons over tp,
    batch over dp), XLA's SPMD partitioner inserts the collectives."""
    _, axes = skeleton(DENSE)
    named = {label: pz.nx.wrap(w).tag(*axes[label]) for label, w in weights.items()}
    shardings = sharding_util.name_to_name_sharding(named, mesh, {"heads": "tp", "neurons": "tp"})
    named = jax.tree.map(lax.with_sharding_constraint, named, shardings)
    weights = {label: array.unwrap(*axes[label]) for label, array in named.items()}
    tokens = lax.with_sharding_constraint(tokens, NamedSharding(mesh, P("dp", None)))
    logits = forward(DENSE, weights, tokens)
    return lax.with_sharding_constraint(logits, NamedSharding(mesh, P("dp", None, None)))


# ---- grouped-query attention ------------------------------------------------------------------

def inputs_gqa():
    return (weight_specs(GQA), token_spec())


def reference_gqa(weights, tokens):
    return forward(GQA, weights, tokens)


def tp_gqa(weights, tokens, *, mesh):
    return _tensor_parallel(GQA, weights, tokens, mesh)


KV = ("attention/key.weights", "attention/value.weights")


def _kv_replicated_specs():
    return {label: (P() if label.endswith(KV) else spec) for label, spec in _specs(GQA, TP_AXES).items()}


def _slice_kv_group(weights, group_of_shard):
    """K/V weights arrive replicated; each shard keeps the KV head group its query heads use."""
    out = dict(weights)
    n_local = GQA.num_kv_heads // lax.axis_size("tp")
    for label in weights:
        if label.endswith(KV):
            axis = axis_position(GQA, label, "head_groups")
            out[label] = lax.dynamic_slice_in_dim(weights[label], group_of_shard * n_local, n_local, axis)
    return out


def tp_gqa_kv_sliced(weights, tokens, *, mesh):
    return _tensor_parallel(GQA, weights, tokens, mesh, weight_specs_=_kv_replicated_specs(),
                            local_weights=lambda w: _slice_kv_group(w, lax.axis_index("tp")))


def tp_gqa_kv_slice_offset(weights, tokens, *, mesh):
    return _tensor_parallel(GQA, weights, tokens, mesh, weight_specs_=_kv_replicated_specs(),
                            local_weights=lambda w: _slice_kv_group(w, (lax.axis_index("tp") + 1) % lax.axis_size("tp")))  # BUG: shard i takes KV group i+1: its query heads attend with another group's keys and values
