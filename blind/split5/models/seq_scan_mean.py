# Causal running average over the sequence (the "cumulative mean" token mixer of some
# linear-attention models), with the sequence split over 'sp'. Each shard adds the totals of the
# shards before it and divides by global positions.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, C = 3, 16, 8


def spec():
    return (jax.ShapeDtypeStruct((B, S, C), jnp.float32), jax.ShapeDtypeStruct((C, C), jnp.float32))


def cummean_mixer(x, w):
    v = x @ w
    csum = jnp.cumsum(v, axis=1)
    pos = jnp.arange(1, S + 1, dtype=jnp.float32)[None, :, None]
    return x + csum / pos


def cummean_mixer_sp(x, w):
    def shard_fn(x, w):
        me = lax.axis_index("sp")
        n = lax.axis_size("sp")
        s_local = x.shape[1]
        v = x @ w
        csum = jnp.cumsum(v, axis=1)
        totals = lax.all_gather(csum[:, -1, :], "sp")  # [n, B, C]
        earlier = (jnp.arange(n) < me)[:, None, None]
        carry = jnp.sum(jnp.where(earlier, totals, 0.0), axis=0)
        pos = (me * s_local + jnp.arange(1, s_local + 1)).astype(jnp.float32)[None, :, None]
        return x + (csum + carry[:, None, :]) / pos

    return jax.shard_map(shard_fn, in_specs=(P(None, "sp", None), P()),
                         out_specs=P(None, "sp", None))(x, w)


def cummean_mixer_sp_inclusive(x, w):
    def shard_fn(x, w):
        me = lax.axis_index("sp")
        n = lax.axis_size("sp")
        s_local = x.shape[1]
        v = x @ w
        csum = jnp.cumsum(v, axis=1)
        totals = lax.all_gather(csum[:, -1, :], "sp")  # [n, B, C]
        earlier = (jnp.arange(n) <= me)[:, None, None]
        carry = jnp.sum(jnp.where(earlier, totals, 0.0), axis=0)
        pos = (me * s_local + jnp.arange(1, s_local + 1)).astype(jnp.float32)[None, :, None]
        return x + (csum + carry[:, None, :]) / pos

    return jax.shard_map(shard_fn, in_specs=(P(None, "sp", None), P()),
                         out_specs=P(None, "sp", None))(x, w)
