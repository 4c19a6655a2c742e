"""Self-attention with one fused QKV projection, heads split with hand-written einops patterns."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 8, 16, 4, 4


def split_qkv(t, n_heads):
    # "b s (three h d) -> three b h s d"
    b, s, _ = t.shape
    return t.reshape(b, s, 3, n_heads, -1).transpose(2, 0, 3, 1, 4)


def merge_heads(o):
    # "b h s d -> b s (h d)"
    b, h, s, d = o.shape
    return o.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def attend(q, k, v):
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


def self_attention(x, w_qkv, w_o):
    q, k, v = split_qkv(x @ w_qkv, H)
    return merge_heads(attend(q, k, v)) @ w_o


def arg_shapes():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((D, 3 * H * HD), f),
            jax.ShapeDtypeStruct((H * HD, D), f))


def _heads_local(x, w_qkv_local, w_o_local):
    n_local = w_o_local.shape[0] // HD
    q, k, v = split_qkv(x @ w_qkv_local.reshape(D, -1), n_local)
    return jax.lax.psum(merge_heads(attend(q, k, v)) @ w_o_local, "tp")


def self_attention_tp(x, w_qkv, w_o):
    # "d (three h e) -> d three h e" so that the head axis can be split
    w4 = w_qkv.reshape(D, 3, H, HD)
    fn = jax.shard_map(_heads_local,
                       in_specs=(P(), P(None, None, "tp", None), P("tp", None)),
                       out_specs=P())
    return fn(x, w4, w_o)


def self_attention_tp_flat(x, w_qkv, w_o):
    fn = jax.shard_map(_heads_local,
                       in_specs=(P(), P(None, "tp"), P("tp", None)),
                       out_specs=P())
    return fn(x, w_qkv, w_o)
