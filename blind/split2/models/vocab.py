"""Vocab-parallel embedding lookup and softmax cross-entropy, written with jax.lax primitives.

The vocabulary (rows of the embedding table, columns of the unembedding) is split over `vocab`;
each rank compares token ids against its shard's first id to find the ones it owns.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

VOCAB, DIM, BATCH, SEQ = 64, 16, 4, 8


def lookup(table, ids):
    return jnp.take(table, ids, axis=0)


def lookup_inputs():
    return (jax.ShapeDtypeStruct((VOCAB, DIM), jnp.float32),
            jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32))


def _local_rows(table_shard, ids, upper_bound_check):
    rows = table_shard.shape[0]
    first = lax.axis_index("vocab") * rows
    local = lax.sub(ids, lax.convert_element_type(first, ids.dtype))
    owned = lax.ge(local, lax.full_like(local, 0))
    if upper_bound_check:
        owned = lax.bitwise_and(owned, lax.lt(local, lax.full_like(local, rows)))
    picked = jnp.take(table_shard, lax.clamp(0, local, rows - 1), axis=0)
    mask = lax.broadcast_in_dim(owned, picked.shape, (0, 1))
    return lax.select(mask, picked, lax.full_like(picked, 0.0))


def lookup_vp(table, ids, mesh):
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("vocab", None), P("batch", None)),
                       out_specs=P("batch", None, None))
    def run(table_shard, ids):
        return lax.psum(_local_rows(table_shard, ids, upper_bound_check=True), "vocab")

    return run(table, ids)


def lookup_vp_v2(table, ids, mesh):
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("vocab", None), P("batch", None)),
                       out_specs=P("batch", None, None))
    def run(table_shard, ids):
        return lax.psum(_local_rows(table_shard, ids, upper_bound_check=False), "vocab")

    return run(table, ids)


def token_nll(hidden, unembed, labels):
    """Per-token negative log-likelihood, [batch, seq]."""
    logits = lax.dot_general(hidden, unembed, (((2,), (0,)), ((), ())))
    top = lax.stop_gradient(lax.reduce_max(logits, (2,)))
    shifted = lax.sub(logits, lax.broadcast_in_dim(top, logits.shape, (0, 1)))
    log_z = lax.log(lax.reduce_sum(lax.exp(shifted), (2,)))
    target = jnp.take_along_axis(shifted, labels[..., None], axis=2)[..., 0]
    return lax.sub(log_z, target)


def token_nll_inputs():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, DIM), jnp.float32),
            jax.ShapeDtypeStruct((DIM, VOCAB), jnp.float32),
            jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32))


def _nll_local(hidden, unembed_shard, labels, upper):
    width = unembed_shard.shape[1]
    logits = lax.dot_general(hidden, unembed_shard, (((2,), (0,)), ((), ())))
    top = lax.pmax(lax.reduce_max(logits, (2,)), "vocab")
    shifted = lax.sub(logits, lax.broadcast_in_dim(top, logits.shape, (0, 1)))
    log_z = lax.log(lax.psum(lax.reduce_sum(lax.exp(shifted), (2,)), "vocab"))
    local = labels - lax.axis_index("vocab") * width
    owned = (local >= 0) & upper(local, width)
    hit = jnp.take_along_axis(shifted, jnp.clip(local, 0, width - 1)[..., None], axis=2)[..., 0]
    target = lax.psum(lax.select(owned, hit, jnp.zeros_like(hit)), "vocab")
    return lax.sub(log_z, target)


def token_nll_vp(hidden, unembed, labels, mesh):
    body = functools.partial(_nll_local, upper=lambda local, width: local < width)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "vocab"), P()),
                         out_specs=P(), check_vma=False)(hidden, unembed, labels)


def token_nll_vp_v2(hidden, unembed, labels, mesh):
    body = functools.partial(_nll_local, upper=lambda local, width: local <= width)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "vocab"), P()),
                         out_specs=P(), check_vma=False)(hidden, unembed, labels)
