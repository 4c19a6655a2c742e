"""Grouped-query causal attention through jax.nn.dot_product_attention."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, T, D_MODEL = 2, 8, 16
N_Q, N_KV, HEAD = 8, 2, 4


def gqa_block(x, wq, wk, wv, wo):
    b, t, _ = x.shape
    q = (x @ wq).reshape(b, t, N_Q, HEAD)
    k = (x @ wk).reshape(b, t, N_KV, HEAD)
    v = (x @ wv).reshape(b, t, N_KV, HEAD)
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return o.reshape(b, t, N_Q * HEAD) @ wo


def gqa_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, T, D_MODEL), f),
            jax.ShapeDtypeStruct((D_MODEL, N_Q * HEAD), f),
            jax.ShapeDtypeStruct((D_MODEL, N_KV * HEAD), f),
            jax.ShapeDtypeStruct((D_MODEL, N_KV * HEAD), f),
            jax.ShapeDtypeStruct((N_Q * HEAD, D_MODEL), f))


def _make_shard_fn(kv_head_of_shard):
    def shard_fn(x, wq, wk, wv, wo):
        b, t, _ = x.shape
        q_local = wq.shape[1] // HEAD
        q = (x @ wq).reshape(b, t, q_local, HEAD)
        k = (x @ wk).reshape(b, t, N_KV, HEAD)
        v = (x @ wv).reshape(b, t, N_KV, HEAD)
        kv = kv_head_of_shard(lax.axis_index("heads"), q_local)
        k = lax.dynamic_slice_in_dim(k, kv, 1, axis=2)
        v = lax.dynamic_slice_in_dim(v, kv, 1, axis=2)
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return lax.psum(o.reshape(b, t, q_local * HEAD) @ wo, "heads")

    return shard_fn


def _wrap(shard_fn, args):
    fn = jax.shard_map(shard_fn, in_specs=(P(), P(None, "heads"), P(), P(), P("heads", None)),
                       out_specs=P())
    return fn(*args)


def gqa_block_tp(x, wq, wk, wv, wo):
    group = N_Q // N_KV
    return _wrap(_make_shard_fn(lambda i, q_local: (i * q_local) // group), (x, wq, wk, wv, wo))


def gqa_block_tp_v2(x, wq, wk, wv, wo):
    return _wrap(_make_shard_fn(lambda i, q_local: i % N_KV), (x, wq, wk, wv, wo))
