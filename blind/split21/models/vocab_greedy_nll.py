"""A tiny tied-embedding language model over a 64-token vocabulary (embedding lookup, one tanh
layer, logits against the same table), split over vocabulary shards of the table.

- `masked_nll` / `masked_nll_tp`: mean next-token NLL over labels that are not the pad id 0, on
  {tp: 4}; each rank looks up the ids it owns (masked lookup + psum), computes its logit columns,
  and the log-sum-exp and label logit are combined with pmax/psum;
- `greedy` / `greedy_dp_tp`: greedy decoding step (argmax id and its logit) on {dp: 2, tp: 2};
  each rank's best local id is made global and the winners are all-gathered.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, V, D = 8, 8, 64, 16
PAD = 0


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = jax.ShapeDtypeStruct((B, T), jnp.int32)
    return f(V, D), f(D, D), i, i


def _hidden(table, w, ids):
    return jnp.tanh(table[ids] @ w)


def masked_nll(table, w, ids, labels):
    logp = jax.nn.log_softmax(_hidden(table, w, ids) @ table.T, -1)
    nll = -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]
    keep = (labels != PAD).astype(nll.dtype)
    return jnp.sum(nll * keep) / jnp.maximum(jnp.sum(keep), 1.0)


def greedy(table, w, ids, labels):
    del labels
    logits = _hidden(table, w, ids) @ table.T
    return jnp.argmax(logits, -1), jnp.max(logits, -1)


def _owned(ids, lo, vl):
    return (ids >= lo) & (ids < lo + vl)


def _owned_inclusive(ids, lo, vl):
    return (ids >= lo) & (ids <= lo + vl)


def _lookup(shard, ids, owned):
    vl = shard.shape[0]
    lo = lax.axis_index("tp") * vl
    mine = owned(ids, lo, vl)
    rows = shard[jnp.clip(ids - lo, 0, vl - 1)]
    return lax.psum(jnp.where(mine[..., None], rows, 0.0), "tp")


def _nll_local(shard, w, ids, labels, owned):
    vl = shard.shape[0]
    lo = lax.axis_index("tp") * vl
    logits = jnp.tanh(_lookup(shard, ids, owned) @ w) @ shard.T
    m = lax.pmax(lax.stop_gradient(logits.max(-1)), "tp")
    lse = m + jnp.log(lax.psum(jnp.exp(logits - m[..., None]).sum(-1), "tp"))
    pick = jnp.take_along_axis(logits, jnp.clip(labels - lo, 0, vl - 1)[..., None], -1)[..., 0]
    label_logit = lax.psum(jnp.where(_owned(labels, lo, vl), pick, 0.0), "tp")
    keep = (labels != PAD).astype(lse.dtype)
    return jnp.sum((lse - label_logit) * keep) / jnp.maximum(jnp.sum(keep), 1.0)


def _run_nll(table, w, ids, labels, mesh, owned):
    local = lambda *a: _nll_local(*a, owned)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P("tp"), P(), P(), P()), out_specs=P())(table, w, ids, labels)


def masked_nll_tp(table, w, ids, labels, mesh):
    return _run_nll(table, w, ids, labels, mesh, _owned)


def masked_nll_tp_inclusive_owner(table, w, ids, labels, mesh):
    return _run_nll(table, w, ids, labels, mesh, _owned_inclusive)


def _local_best(logits, lo):
    return jnp.argmax(logits, -1) + lo, jnp.max(logits, -1)


def _local_best_no_offset(logits, lo):
    return jnp.argmax(logits, -1), jnp.max(logits, -1)


def _greedy_local(shard, w, ids, best):
    lo = lax.axis_index("tp") * shard.shape[0]
    logits = jnp.tanh(_lookup(shard, ids, _owned) @ w) @ shard.T
    idx, val = best(logits, lo)
    all_idx = lax.all_gather(idx, "tp", axis=-1)
    all_val = lax.all_gather(val, "tp", axis=-1)
    win = jnp.argmax(all_val, -1)
    return jnp.take_along_axis(all_idx, win[..., None], -1)[..., 0], jnp.max(all_val, -1)


def _run_greedy(table, w, ids, mesh, best):
    local = lambda shard, w, ids: _greedy_local(shard, w, ids, best)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P("tp"), P(), P("dp")),
                         out_specs=(P("dp"), P("dp")))(table, w, ids)


def greedy_dp_tp(table, w, ids, labels, mesh):
    return _run_greedy(table, w, ids, mesh, _local_best)


def greedy_dp_tp_local_index(table, w, ids, labels, mesh):
    return _run_greedy(table, w, ids, mesh, _local_best_no_offset)
