"""Vocabulary-parallel embedding and softmax cross-entropy (Megatron).

The embedding table and the output logits are split along the vocabulary. Lookup: each
shard masks the token ids outside its range, looks up the rest locally and the results are
summed. Cross-entropy: the global max (pmax), the sum of exponentials and the target logit
(psum) are reduced across shards; the full logits are never materialised.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import spec

B, S, V, D = 4, 16, 32, 32
T = 16  # tokens in the loss
TP = "tp"


def embed(table, ids):
    return table[ids]


def embed_inputs():
    return (spec(V, D), spec(B, S, dtype=jnp.int32))


def embed_tp(table, ids, *, mesh):
    def body(table, ids):
        n_local = table.shape[0]
        lo = lax.axis_index(TP) * n_local
        mine = (ids >= lo) & (ids < lo + n_local)
        local_ids = jnp.where(mine, ids - lo, 0)
        out = table[local_ids] * mine[..., None]
        return lax.psum(out, TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P())(table, ids)


def embed_tp_off_by_one(table, ids, *, mesh):
    def body(table, ids):
        n_local = table.shape[0]
        lo = lax.axis_index(TP) * n_local
        mine = (ids >= lo) & (ids <= lo + n_local)  # BUG: <= also claims the first id of the next shard
        local_ids = jnp.where(mine, ids - lo, 0)
        out = table[local_ids] * mine[..., None]
        return lax.psum(out, TP)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P())(table, ids)


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy. logits: (T, V), labels: (T,) int."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(lse - target)


def cross_entropy_inputs():
    return (spec(T, V), spec(T, dtype=jnp.int32))


def cross_entropy_tp(logits, labels, *, mesh):
    def body(logits, labels):  # logits: (T, V / tp)
        n_local = logits.shape[-1]
        lo = lax.axis_index(TP) * n_local
        m = lax.pmax(lax.stop_gradient(jnp.max(logits, axis=-1)), TP)
        sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), TP)
        lse = m + jnp.log(sum_exp)
        mine = (labels >= lo) & (labels < lo + n_local)
        local = jnp.take_along_axis(logits, jnp.where(mine, labels - lo, 0)[:, None], axis=-1)[:, 0]
        target = lax.psum(jnp.where(mine, local, 0.0), TP)
        return jnp.mean(lse - target)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP), P()), out_specs=P())(logits, labels)


def cross_entropy_tp_local_max(logits, labels, *, mesh):
    def body(logits, labels):
        n_local = logits.shape[-1]
        lo = lax.axis_index(TP) * n_local
        m = lax.stop_gradient(jnp.max(logits, axis=-1))  # BUG: shard-local max; the shards' exponentials no longer share one shift
        sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), TP)
        lse = lax.pmean(m + jnp.log(sum_exp), TP)
        mine = (labels >= lo) & (labels < lo + n_local)
        local = jnp.take_along_axis(logits, jnp.where(mine, labels - lo, 0)[:, None], axis=-1)[:, 0]
        target = lax.psum(jnp.where(mine, local, 0.0), TP)
        return jnp.mean(lse - target)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP), P()), out_specs=P())(logits, labels)
