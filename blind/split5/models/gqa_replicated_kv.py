"""GQA where the tensor-parallel degree (4) exceeds the number of KV heads (2).

Query heads are sharded over 'tp'; the small K/V projections are replicated and each device
picks the KV head its query heads belong to.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D = 2, 8, 16
NQ, NKV, HD = 8, 2, 4


def arg_shapes():
    return (jax.ShapeDtypeStruct((B, T, D), jnp.float32),
            jax.ShapeDtypeStruct((D, NQ, HD), jnp.float32),
            jax.ShapeDtypeStruct((D, NKV, HD), jnp.float32),
            jax.ShapeDtypeStruct((D, NKV, HD), jnp.float32),
            jax.ShapeDtypeStruct((NQ, HD, D), jnp.float32))


def gqa(x, wq, wk, wv, wo):
    q = jnp.einsum("btd,dhk->bthk", x, wq)
    k = jnp.einsum("btd,dhk->bthk", x, wk)
    v = jnp.einsum("btd,dhk->bthk", x, wv)
    q = q.reshape(B, T, NKV, NQ // NKV, HD)
    s = jnp.einsum("btgqk,bsgk->bgqts", q, k) / jnp.sqrt(HD)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bgqts,bsgk->btgqk", p, v).reshape(B, T, NQ, HD)
    return jnp.einsum("bthk,hkd->btd", o, wo)


def gqa_tp(x, wq, wk, wv, wo):
    def body(x, wq, wk, wv, wo):
        tp = lax.axis_size("tp")
        kv_head = lax.axis_index("tp") // (tp // NKV)
        q = jnp.einsum("btd,dhk->bthk", x, wq)
        k = jnp.einsum("btd,dk->btk", x, lax.dynamic_index_in_dim(wk, kv_head, 1, keepdims=False))
        v = jnp.einsum("btd,dk->btk", x, lax.dynamic_index_in_dim(wv, kv_head, 1, keepdims=False))
        s = jnp.einsum("bthk,bsk->bhts", q, k) / jnp.sqrt(HD)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhts,bsk->bthk", p, v)
        return lax.psum(jnp.einsum("bthk,hkd->btd", o, wo), "tp")

    return jax.shard_map(body, in_specs=(P(), P(None, "tp"), P(), P(), P("tp")),
                         out_specs=P())(x, wq, wk, wv, wo)


def gqa_tp_modulo(x, wq, wk, wv, wo):
    def body(x, wq, wk, wv, wo):
        kv_head = lax.axis_index("tp") % NKV
        q = jnp.einsum("btd,dhk->bthk", x, wq)
        k = jnp.einsum("btd,dk->btk", x, lax.dynamic_index_in_dim(wk, kv_head, 1, keepdims=False))
        v = jnp.einsum("btd,dk->btk", x, lax.dynamic_index_in_dim(wv, kv_head, 1, keepdims=False))
        s = jnp.einsum("bthk,bsk->bhts", q, k) / jnp.sqrt(HD)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhts,bsk->bthk", p, v)
        return lax.psum(jnp.einsum("bthk,hkd->btd", o, wo), "tp")

    return jax.shard_map(body, in_specs=(P(), P(None, "tp"), P(), P(), P("tp")),
                         out_specs=P())(x, wq, wk, wv, wo)
