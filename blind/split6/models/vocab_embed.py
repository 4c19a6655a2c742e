"""Vocabulary-parallel token embedding (scaled by sqrt(d)) with the table's rows sharded over 'tp'."""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

VOCAB, DIM, BATCH, SEQ, TP = 32, 8, 4, 16, 4


def embed(table, ids):
    return table[ids] * math.sqrt(DIM)


def embed_vocab_parallel(table, ids, mesh):
    rows = VOCAB // TP

    def local(table_rows, ids):
        lo = lax.axis_index("tp") * rows
        hi = lo + rows
        mine = (ids >= lo) & (ids < hi)
        idx = jnp.where(mine, ids - lo, 0)
        vecs = jnp.where(mine[..., None], table_rows[idx], 0.0)
        return lax.psum(vecs, "tp") * math.sqrt(DIM)

    return jax.shard_map(local, mesh=mesh, in_specs=(P("tp", None), P()), out_specs=P())(table, ids)


def embed_vocab_parallel_upper(table, ids, mesh):
    rows = VOCAB // TP

    def local(table_rows, ids):
        lo = lax.axis_index("tp") * rows
        hi = lo + rows
        mine = (ids >= lo) & (ids <= hi)
        idx = jnp.where(mine, ids - lo, 0)
        vecs = jnp.where(mine[..., None], table_rows[idx], 0.0)
        return lax.psum(vecs, "tp") * math.sqrt(DIM)

    return jax.shard_map(local, mesh=mesh, in_specs=(P("tp", None), P()), out_specs=P())(table, ids)


def inputs():
    return (jax.ShapeDtypeStruct((VOCAB, DIM), jnp.float32),
            jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32))
