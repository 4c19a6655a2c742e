"""Token embedding with the table split by rows (vocabulary) over 'vocab'; scaled by sqrt(d)."""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

VOCAB, DIM = 32, 8
BATCH, LEN = 2, 6


def inputs():
    return (jax.ShapeDtypeStruct((BATCH, LEN), jnp.int32),
            jax.ShapeDtypeStruct((VOCAB, DIM), jnp.float32))


def embed(token_ids, table):
    return jnp.take(table, token_ids, axis=0) * math.sqrt(DIM)


def embed_vocab_parallel(token_ids, table, mesh):
    def lookup(ids, rows):
        n_rows = rows.shape[0]
        first = lax.axis_index("vocab") * n_rows
        mine = (ids >= first) & (ids < first + n_rows)
        vec = jnp.take(rows, ids - first, axis=0, mode="clip")
        vec = jnp.where(mine[..., None], vec, 0.0)
        return lax.psum(vec, "vocab") * math.sqrt(DIM)

    return jax.shard_map(lookup, mesh=mesh, in_specs=(P(), P("vocab", None)),
                         out_specs=P())(token_ids, table)


def embed_vocab_parallel_bounds(token_ids, table, mesh):
    def lookup(ids, rows):
        n_rows = rows.shape[0]
        first = lax.axis_index("vocab") * n_rows
        mine = (ids >= first) & (ids <= first + n_rows)
        vec = jnp.take(rows, ids - first, axis=0, mode="clip")
        vec = jnp.where(mine[..., None], vec, 0.0)
        return lax.psum(vec, "vocab") * math.sqrt(DIM)

    return jax.shard_map(lookup, mesh=mesh, in_specs=(P(), P("vocab", None)),
                         out_specs=P())(token_ids, table)
