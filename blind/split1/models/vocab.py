"""Vocab-parallel token embedding and cross-entropy (Megatron style)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

VOCAB, D = 64, 16
BATCH, SEQ = 4, 64


def embed(table, ids):
    return jnp.take(table, ids, axis=0)


def embed_inputs():
    return (jax.ShapeDtypeStruct((VOCAB, D), jnp.float32),
            jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32))


def _vocab_range(v_local):
    start = lax.axis_index("tp") * v_local
    return start, start + v_local


def embed_vp(table, ids, mesh):
    @jax.shard_map(mesh=mesh, in_specs=(P("tp", None), P("dp", None)), out_specs=P("dp", None, None))
    def lookup(table, ids):
        start, end = _vocab_range(table.shape[0])
        in_shard = (ids >= start) & (ids < end)
        rows = jnp.take(table, jnp.where(in_shard, ids - start, 0), axis=0)
        return lax.psum(rows * in_shard[..., None].astype(rows.dtype), "tp")

    return lookup(table, ids)


def embed_vp_inclusive(table, ids, mesh):
    @jax.shard_map(mesh=mesh, in_specs=(P("tp", None), P("dp", None)), out_specs=P("dp", None, None))
    def lookup(table, ids):
        start, end = _vocab_range(table.shape[0])
        in_shard = jnp.logical_and(ids >= start, ids <= end)
        local = jnp.clip(ids - start, 0, table.shape[0] - 1)
        rows = jnp.where(in_shard[..., None], table[local], 0.0)
        return lax.psum(rows, "tp")

    return lookup(table, ids)


def xent(hidden, w_out, labels, loss_mask):
    logits = jnp.einsum("bsd,dv->bsv", hidden, w_out)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    weight = loss_mask.astype(jnp.float32)
    return jnp.sum(nll * weight) / jnp.maximum(weight.sum(), 1.0)


def xent_inputs():
    return (jax.ShapeDtypeStruct((BATCH, SEQ // 4, D), jnp.float32),
            jax.ShapeDtypeStruct((D, VOCAB), jnp.float32),
            jax.ShapeDtypeStruct((BATCH, SEQ // 4), jnp.int32),
            jax.ShapeDtypeStruct((BATCH, SEQ // 4), jnp.bool_))


def _local_nll(logits, labels, row_max):
    """-log p(label) from this rank's vocab slice, given the global max of each row."""
    v_local = logits.shape[-1]
    start, end = _vocab_range(v_local)
    shifted = logits - row_max[..., None]
    sum_exp = lax.psum(jnp.exp(shifted).sum(-1), "tp")
    mine = (labels >= start) & (labels < end)
    idx = jnp.where(mine, labels - start, 0)
    target = jnp.take_along_axis(shifted, idx[..., None], axis=-1)[..., 0]
    target = lax.psum(jnp.where(mine, target, 0.0), "tp")
    return jnp.log(sum_exp) - target


def xent_vp(hidden, w_out, labels, loss_mask, mesh):
    def body(h, w, labels, mask):
        logits = h @ w
        row_max = lax.pmax(lax.stop_gradient(logits.max(-1)), "tp")
        nll = _local_nll(logits, labels, row_max)
        weight = mask.astype(jnp.float32)
        return (nll * weight).sum() / jnp.maximum(weight.sum(), 1.0)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P(), P()),
                         out_specs=P())(hidden, w_out, labels, loss_mask)


def xent_vp_fast(hidden, w_out, labels, loss_mask, mesh):
    def body(h, w, labels, mask):
        logits = h @ w
        row_max = lax.stop_gradient(logits.max(-1))
        nll = _local_nll(logits, labels, row_max)
        weight = mask.astype(jnp.float32)
        return (nll * weight).sum() / jnp.maximum(weight.sum(), 1.0)

    return shard_map(body, mesh, in_specs=(P(), P(None, "tp"), P(), P()), out_specs=P(),
                     check_rep=False)(hidden, w_out, labels, loss_mask)
