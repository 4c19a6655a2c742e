"""Sequence-parallel causal attention: queries stay on their sequence shard, keys and values are
all-gathered; the causal mask compares global query positions with key positions."""
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class Cfg:
    batch: int = 2
    seq: int = 16
    dim: int = 8
    shards: int = 4


CFG = Cfg()


def causal_attention(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(jnp.float32(CFG.dim))
    pos = jnp.arange(CFG.seq)
    allowed = pos[None, :] <= pos[:, None]
    s = jnp.where(allowed[None], s, -jnp.inf)
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)


def _sharded(visible):
    chunk = CFG.seq // CFG.shards

    def local(x, wq, wk, wv):
        q = x @ wq
        k = lax.all_gather(x @ wk, "seq", axis=1, tiled=True)
        v = lax.all_gather(x @ wv, "seq", axis=1, tiled=True)
        s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(jnp.float32(CFG.dim))
        q_pos = lax.axis_index("seq") * chunk + jnp.arange(chunk)
        k_pos = jnp.arange(CFG.seq)
        s = jnp.where(visible(q_pos[:, None], k_pos[None, :])[None], s, -jnp.inf)
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)

    return jax.shard_map(local, in_specs=(P(None, "seq"), P(), P(), P()),
                         out_specs=P(None, "seq"), check_vma=False)


def causal_attention_sp(x, wq, wk, wv):
    return _sharded(lambda qp, kp: kp <= qp)(x, wq, wk, wv)


def causal_attention_sp_strict(x, wq, wk, wv):
    return _sharded(lambda qp, kp: kp < qp)(x, wq, wk, wv)


def make_inputs():
    d = CFG.dim
    return (jax.ShapeDtypeStruct((CFG.batch, CFG.seq, d), jnp.float32),
            *(jax.ShapeDtypeStruct((d, d), jnp.float32) for _ in range(3)))
