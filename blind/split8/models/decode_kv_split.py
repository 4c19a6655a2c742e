"""One decode step of attention over a padded KV cache, the cache split along its length."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, CACHE_LEN, HEADS, DIM = 2, 16, 2, 8
NEG = -1e9


def decode_attention(q, k_cache, v_cache, lengths):
    s = jnp.einsum("bhd,bshd->bhs", q, k_cache) / jnp.sqrt(float(DIM))
    valid = jnp.arange(CACHE_LEN)[None, None, :] < lengths[:, None, None]
    s = jnp.where(valid, s, NEG)
    w = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhs,bshd->bhd", w, v_cache)


def decode_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, HEADS, DIM), f),
            jax.ShapeDtypeStruct((BATCH, CACHE_LEN, HEADS, DIM), f),
            jax.ShapeDtypeStruct((BATCH, CACHE_LEN, HEADS, DIM), f),
            jax.ShapeDtypeStruct((BATCH,), jnp.int32))


def _scores(q, k, lengths):
    chunk = k.shape[1]
    s = jnp.einsum("bhd,bshd->bhs", q, k) / jnp.sqrt(float(DIM))
    pos = lax.axis_index("kv") * chunk + jnp.arange(chunk)
    return jnp.where(pos[None, None, :] < lengths[:, None, None], s, NEG)


def _flash_decode(q, k, v, lengths):
    s = _scores(q, k, lengths)
    m = lax.pmax(s.max(-1, keepdims=True), "kv")
    p = jnp.exp(s - m)
    num = lax.psum(jnp.einsum("bhs,bshd->bhd", p, v), "kv")
    return num / lax.psum(p.sum(-1), "kv")[..., None]


def _flash_decode_local_max(q, k, v, lengths):
    s = _scores(q, k, lengths)
    m = s.max(-1, keepdims=True)
    p = jnp.exp(s - m)
    num = lax.psum(jnp.einsum("bhs,bshd->bhd", p, v), "kv")
    return num / lax.psum(p.sum(-1), "kv")[..., None]


def decode_attention_sharded(q, k_cache, v_cache, lengths):
    cache = P(None, "kv")
    return jax.shard_map(_flash_decode, in_specs=(P(), cache, cache, P()), out_specs=P())(
        q, k_cache, v_cache, lengths)


def decode_attention_sharded_v2(q, k_cache, v_cache, lengths):
    cache = P(None, "kv")
    return jax.shard_map(_flash_decode_local_max, in_specs=(P(), cache, cache, P()),
                         out_specs=P(), check_vma=False)(q, k_cache, v_cache, lengths)
