"""Vocabulary-parallel embedding lookup and cross-entropy loss (Megatron style): the embedding
table and the output projection are split along the vocabulary over 'tp'."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

VOCAB, HIDDEN, BATCH, SEQ, TP = 64, 8, 4, 8, 4
V_LOCAL = VOCAB // TP


def embed(ids, table):
    return table[ids]


def embed_inputs():
    return (
        jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),
        jax.ShapeDtypeStruct((VOCAB, HIDDEN), jnp.float32),
    )


def embed_vp(ids, table, mesh):
    def lookup(ids, shard):
        lo = lax.axis_index("tp") * V_LOCAL
        hit = (ids >= lo) & (ids < lo + V_LOCAL)
        local = jnp.where(hit, ids - lo, 0)
        rows = jnp.take(shard, local, axis=0, mode="clip")
        return lax.psum(jnp.where(hit[..., None], rows, 0.0), "tp")

    return jax.shard_map(lookup, mesh=mesh, in_specs=(P(), P("tp", None)), out_specs=P())(ids, table)


def embed_vp_inclusive_end(ids, table, mesh):
    def lookup(ids, shard):
        lo = lax.axis_index("tp") * V_LOCAL
        hit = (ids >= lo) & (ids <= lo + V_LOCAL)
        local = jnp.where(hit, ids - lo, 0)
        rows = jnp.take(shard, local, axis=0, mode="clip")
        return lax.psum(jnp.where(hit[..., None], rows, 0.0), "tp")

    return jax.shard_map(lookup, mesh=mesh, in_specs=(P(), P("tp", None)), out_specs=P())(ids, table)


def lm_loss(hidden, w_vocab, labels):
    logits = hidden @ w_vocab  # [n, vocab]
    logz = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(logz - target)


def lm_loss_inputs():
    n = BATCH * SEQ
    return (
        jax.ShapeDtypeStruct((n, HIDDEN), jnp.float32),
        jax.ShapeDtypeStruct((HIDDEN, VOCAB), jnp.float32),
        jax.ShapeDtypeStruct((n,), jnp.int32),
    )


def lm_loss_vp(hidden, w_vocab, labels, mesh):
    def local_loss(h, w, y):
        logits = h @ w  # [n, V_LOCAL]
        first = lax.axis_index("tp") * V_LOCAL
        m = lax.pmax(jnp.max(logits, axis=-1), "tp")
        sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp")
        mine = (y >= first) & (y < first + V_LOCAL)
        idx = jnp.clip(y - first, 0, V_LOCAL - 1)
        picked = jnp.take_along_axis(logits, idx[:, None], axis=-1)[:, 0]
        target = lax.psum(jnp.where(mine, picked, 0.0), "tp")
        return jnp.mean(jnp.log(sum_exp) + m - target)

    return jax.shard_map(local_loss, mesh=mesh, in_specs=(P(), P(None, "tp"), P()), out_specs=P())(
        hidden, w_vocab, labels
    )


def lm_loss_vp_local_max(hidden, w_vocab, labels, mesh):
    def local_loss(h, w, y):
        logits = h @ w
        first = lax.axis_index("tp") * V_LOCAL
        m = jnp.max(logits, axis=-1)
        sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp")
        mine = (y >= first) & (y < first + V_LOCAL)
        idx = jnp.clip(y - first, 0, V_LOCAL - 1)
        picked = jnp.take_along_axis(logits, idx[:, None], axis=-1)[:, 0]
        target = lax.psum(jnp.where(mine, picked, 0.0), "tp")
        return jnp.mean(jnp.log(sum_exp) + lax.pmean(m, "tp") - target)

    return jax.shard_map(local_loss, mesh=mesh, in_specs=(P(), P(None, "tp"), P()), out_specs=P())(
        hidden, w_vocab, labels
    )
