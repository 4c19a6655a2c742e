"""Grouped-query attention: 8 query heads share 2 KV heads; 4-way TP, so 2 shards share each KV head."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class Cfg:
    batch: int = 2
    seq: int = 6
    dim: int = 16
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 4


CFG = Cfg()


def gqa_inputs(c=CFG):
    f = jnp.float32
    return (jax.ShapeDtypeStruct((c.batch, c.seq, c.dim), f),
            jax.ShapeDtypeStruct((c.dim, c.q_heads, c.head_dim), f),
            jax.ShapeDtypeStruct((c.dim, c.kv_heads, c.head_dim), f),
            jax.ShapeDtypeStruct((c.dim, c.kv_heads, c.head_dim), f),
            jax.ShapeDtypeStruct((c.q_heads, c.head_dim, c.dim), f))


def _core(x, wq, wk, wv, wo, group):
    q = jnp.einsum("bsd,dhk->bshk", x, wq)
    k = jnp.repeat(jnp.einsum("bsd,dhk->bshk", x, wk), group, axis=2)
    v = jnp.repeat(jnp.einsum("bsd,dhk->bshk", x, wv), group, axis=2)
    logits = jnp.einsum("bshk,bthk->bhst", q, k) / jnp.sqrt(jnp.float32(CFG.head_dim))
    ctx = jnp.einsum("bhst,bthk->bshk", jax.nn.softmax(logits, axis=-1), v)
    return jnp.einsum("bshk,hkd->bsd", ctx, wo)


def gqa(x, wq, wk, wv, wo):
    return _core(x, wq, wk, wv, wo, CFG.q_heads // CFG.kv_heads)


def gqa_tp(x, wq, wk, wv, wo, mesh):
    tp = mesh.shape["tp"]
    shards_per_kv = tp // CFG.kv_heads

    def body(x, wq, wk, wv, wo):
        kv = lax.axis_index("tp") // shards_per_kv
        wk_l = lax.dynamic_slice_in_dim(wk, kv, 1, axis=1)
        wv_l = lax.dynamic_slice_in_dim(wv, kv, 1, axis=1)
        return lax.psum(_core(x, wq, wk_l, wv_l, wo, wq.shape[1]), "tp")

    return jax.shard_map(body, mesh=mesh,
                         in_specs=(P(), P(None, "tp", None), P(), P(), P("tp", None, None)),
                         out_specs=P())(x, wq, wk, wv, wo)


def gqa_tp_modulo(x, wq, wk, wv, wo, mesh):
    def body(x, wq, wk, wv, wo):
        kv = lax.axis_index("tp") % CFG.kv_heads
        wk_l = lax.dynamic_slice_in_dim(wk, kv, 1, axis=1)
        wv_l = lax.dynamic_slice_in_dim(wv, kv, 1, axis=1)
        return lax.psum(_core(x, wq, wk_l, wv_l, wo, wq.shape[1]), "tp")

    return jax.shard_map(body, mesh=mesh,
                         in_specs=(P(), P(None, "tp", None), P(), P(), P("tp", None, None)),
                         out_specs=P())(x, wq, wk, wv, wo)
