"""Token embedding with the table split over the vocabulary (Megatron VocabParallelEmbedding)."""
import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

VOCAB, WIDTH, BATCH, LENGTH = 32, 8, 2, 10


@dataclasses.dataclass(frozen=True)
class Embed:
    vocab: int = VOCAB
    width: int = WIDTH
    scale_by_sqrt_width: bool = True

    def __call__(self, table, ids):
        out = table[ids]
        if self.scale_by_sqrt_width:
            out = out * jnp.sqrt(jnp.float32(self.width))
        return out


def abstract_args():
    return (jax.ShapeDtypeStruct((VOCAB, WIDTH), jnp.float32),
            jax.ShapeDtypeStruct((BATCH, LENGTH), jnp.int32))


def embed(table, ids):
    return Embed()(table, ids)


@dataclasses.dataclass(frozen=True)
class VocabParallelEmbed(Embed):
    axis: str = "vocab"

    def __call__(self, table_shard, ids):
        per_shard = table_shard.shape[0]
        lo = lax.axis_index(self.axis) * per_shard
        hi = lo + per_shard
        outside = (ids < lo) | (ids >= hi)
        local_ids = jnp.clip(ids - lo, 0, per_shard - 1)
        out = jnp.where(outside[..., None], 0.0, table_shard[local_ids])
        out = lax.psum(out, self.axis)
        if self.scale_by_sqrt_width:
            out = out * jnp.sqrt(jnp.float32(self.width))
        return out


@dataclasses.dataclass(frozen=True)
class VocabParallelEmbedInclusive(Embed):
    axis: str = "vocab"

    def __call__(self, table_shard, ids):
        per_shard = table_shard.shape[0]
        lo = lax.axis_index(self.axis) * per_shard
        hi = lo + per_shard
        outside = (ids < lo) | (ids > hi)
        local_ids = jnp.clip(ids - lo, 0, per_shard - 1)
        out = jnp.where(outside[..., None], 0.0, table_shard[local_ids])
        out = lax.psum(out, self.axis)
        if self.scale_by_sqrt_width:
            out = out * jnp.sqrt(jnp.float32(self.width))
        return out


def embed_vp(table, ids, mesh):
    return jax.shard_map(VocabParallelEmbed(), mesh=mesh, in_specs=(P("vocab", None), P()),
                         out_specs=P())(table, ids)


def embed_vp_inclusive(table, ids, mesh):
    return jax.shard_map(VocabParallelEmbedInclusive(), mesh=mesh,
                         in_specs=(P("vocab", None), P()), out_specs=P())(table, ids)
