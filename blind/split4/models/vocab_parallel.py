"""Vocabulary-parallel token embedding and softmax cross-entropy (Megatron style)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

VOCAB, HIDDEN, BATCH, LEN = 32, 8, 2, 6


def embed_inputs():
    return (jax.ShapeDtypeStruct((BATCH, LEN), jnp.int32),
            jax.ShapeDtypeStruct((VOCAB, HIDDEN), jnp.float32))


def embed(tokens, table):
    return jnp.take(table, tokens, axis=0)


def embed_vp(tokens, table, mesh):
    def part(tokens, table):
        rows = table.shape[0]
        lo = lax.axis_index("vocab") * rows
        inside = (tokens >= lo) & (tokens < lo + rows)
        local = jnp.where(inside, tokens - lo, 0)
        out = table[local] * inside[..., None].astype(table.dtype)
        return lax.psum(out, "vocab")

    return jax.shard_map(part, mesh=mesh, in_specs=(P(), P("vocab", None)),
                         out_specs=P())(tokens, table)


def embed_vp_inclusive(tokens, table, mesh):
    def part(tokens, table):
        rows = table.shape[0]
        lo = lax.axis_index("vocab") * rows
        inside = (tokens >= lo) & (tokens <= lo + rows)
        local = jnp.where(inside, tokens - lo, 0)
        out = table[local] * inside[..., None].astype(table.dtype)
        return lax.psum(out, "vocab")

    return jax.shard_map(part, mesh=mesh, in_specs=(P(), P("vocab", None)),
                         out_specs=P())(tokens, table)


def xent_inputs():
    return (jax.ShapeDtypeStruct((BATCH * LEN, HIDDEN), jnp.float32),
            jax.ShapeDtypeStruct((HIDDEN, VOCAB), jnp.float32),
            jax.ShapeDtypeStruct((BATCH * LEN,), jnp.int32))


def xent(h, w_unembed, labels):
    logits = h @ w_unembed
    logz = jax.scipy.special.logsumexp(logits, axis=-1)
    gold = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(logz - gold)


class VocabParallelXent:
    """Each device holds a contiguous vocabulary slice of the unembedding."""

    def __init__(self, mesh, axis="vocab"):
        self.mesh, self.axis = mesh, axis

    def local_loss(self, h, w, labels):
        logits = h @ w
        width = logits.shape[-1]
        m = lax.pmax(jnp.max(logits, axis=-1), self.axis)
        m = lax.stop_gradient(m)
        sumexp = lax.psum(jnp.exp(logits - m[:, None]).sum(-1), self.axis)
        first = lax.axis_index(self.axis) * width
        mine = (labels >= first) & (labels < first + width)
        idx = jnp.clip(labels - first, 0, width - 1)
        picked = jnp.take_along_axis(logits, idx[:, None], axis=-1)[:, 0]
        gold = lax.psum(jnp.where(mine, picked, 0.0), self.axis)
        return jnp.mean(jnp.log(sumexp) + m - gold)

    def __call__(self, h, w, labels):
        return jax.shard_map(self.local_loss, mesh=self.mesh,
                             in_specs=(P(), P(None, self.axis), P()), out_specs=P(),
                             check_vma=False)(h, w, labels)


class LocalMaxXent(VocabParallelXent):
    def local_loss(self, h, w, labels):
        logits = h @ w
        width = logits.shape[-1]
        m = jnp.max(logits, axis=-1)
        sumexp = lax.psum(jnp.exp(logits - m[:, None]).sum(-1), self.axis)
        first = lax.axis_index(self.axis) * width
        mine = (labels >= first) & (labels < first + width)
        idx = jnp.clip(labels - first, 0, width - 1)
        picked = jnp.take_along_axis(logits, idx[:, None], axis=-1)[:, 0]
        gold = lax.psum(jnp.where(mine, picked, 0.0), self.axis)
        return jnp.mean(jnp.log(sumexp) + m - gold)


def xent_vp(h, w_unembed, labels, mesh):
    return VocabParallelXent(mesh)(h, w_unembed, labels)


def xent_vp_local_max(h, w_unembed, labels, mesh):
    return LocalMaxXent(mesh)(h, w_unembed, labels)
