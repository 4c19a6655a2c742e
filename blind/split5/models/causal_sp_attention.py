"""Single-head causal attention with the sequence split over 'seq'.

Each device keeps its query block, all-gathers keys and values, and builds the causal mask from
global query positions (block offset from axis_index plus an iota).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D = 2, 16, 8


def inputs():
    return tuple(jax.ShapeDtypeStruct(s, jnp.float32) for s in [(B, S, D), (D, D), (D, D), (D, D)])


def causal_attention(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(D)
    qi = lax.broadcasted_iota(jnp.int32, (S, S), 0)
    ki = lax.broadcasted_iota(jnp.int32, (S, S), 1)
    scores = jnp.where(ki <= qi, scores, -jnp.inf)
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, axis=-1), v)


def causal_attention_sp(x, wq, wk, wv, mesh):
    def blockwise(x_blk, wq, wk, wv):
        blk = x_blk.shape[1]
        q = x_blk @ wq
        k = lax.all_gather(x_blk @ wk, "seq", axis=1, tiled=True)
        v = lax.all_gather(x_blk @ wv, "seq", axis=1, tiled=True)
        scores = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(D)
        q_pos = lax.axis_index("seq") * blk + lax.broadcasted_iota(jnp.int32, (blk, S), 0)
        k_pos = lax.broadcasted_iota(jnp.int32, (blk, S), 1)
        scores = jnp.where(k_pos <= q_pos, scores, -jnp.inf)
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, axis=-1), v)

    return jax.shard_map(blockwise, mesh=mesh, in_specs=(P(None, "seq"), P(), P(), P()),
                         out_specs=P(None, "seq"))(x, wq, wk, wv)


def causal_attention_sp_no_stride(x, wq, wk, wv, mesh):
    def blockwise(x_blk, wq, wk, wv):
        blk = x_blk.shape[1]
        q = x_blk @ wq
        k = lax.all_gather(x_blk @ wk, "seq", axis=1, tiled=True)
        v = lax.all_gather(x_blk @ wv, "seq", axis=1, tiled=True)
        scores = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(D)
        q_pos = lax.axis_index("seq") + lax.broadcasted_iota(jnp.int32, (blk, S), 0)
        k_pos = lax.broadcasted_iota(jnp.int32, (blk, S), 1)
        scores = jnp.where(k_pos <= q_pos, scores, -jnp.inf)
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, axis=-1), v)

    return jax.shard_map(blockwise, mesh=mesh, in_specs=(P(None, "seq"), P(), P(), P()),
                         out_specs=P(None, "seq"))(x, wq, wk, wv)
