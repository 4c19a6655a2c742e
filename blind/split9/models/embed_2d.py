"""Token embedding scaled by sqrt(d) plus learned absolute positions, written as a small module class.

Distributed: mesh (dp, tp); the batch is split over dp, the vocabulary table over tp.
"""
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

VOCAB, D, SEQ = 96, 8, 12


def abstract_args():
    return (jax.ShapeDtypeStruct((4, SEQ), jnp.int32),
            jax.ShapeDtypeStruct((VOCAB, D), jnp.float32),
            jax.ShapeDtypeStruct((SEQ, D), jnp.float32))


def embed(tokens, table, pos_table):
    return table[tokens] * math.sqrt(D) + pos_table[None]


class VocabParallelEmbedding:
    def __init__(self, mesh, vocab_axis="tp", batch_axis="dp"):
        self.mesh, self.vocab_axis, self.batch_axis = mesh, vocab_axis, batch_axis

    def shard_range(self):
        rows = VOCAB // jax.lax.axis_size(self.vocab_axis)
        lo = jax.lax.axis_index(self.vocab_axis) * rows
        return lo, lo + rows

    def lookup(self, tokens, table_shard, pos_table):
        lo, hi = self.shard_range()
        outside = (tokens < lo) | (tokens >= hi)
        local = jnp.clip(tokens - lo, 0, table_shard.shape[0] - 1)
        vecs = jnp.where(outside[..., None], 0.0, table_shard[local])
        return jax.lax.psum(vecs, self.vocab_axis) * math.sqrt(D) + pos_table[None]

    def __call__(self, tokens, table, pos_table):
        return jax.shard_map(self.lookup, mesh=self.mesh,
                             in_specs=(P(self.batch_axis), P(self.vocab_axis), P()),
                             out_specs=P(self.batch_axis))(tokens, table, pos_table)


class VocabParallelEmbeddingV2(VocabParallelEmbedding):
    def shard_range(self):
        rows = VOCAB // jax.lax.axis_size(self.batch_axis)
        lo = jax.lax.axis_index(self.vocab_axis) * rows
        return lo, lo + rows


def embed_vp(tokens, table, pos_table, mesh):
    return VocabParallelEmbedding(mesh)(tokens, table, pos_table)


def embed_vp_v2(tokens, table, pos_table, mesh):
    return VocabParallelEmbeddingV2(mesh)(tokens, table, pos_table)
