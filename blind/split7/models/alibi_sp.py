"""Causal multi-head attention with ALiBi linear biases; the query sequence is split over 'sp'
(keys/values come from the all-gathered sequence), positions rebuilt from iota + axis_index."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_HEADS, HEAD, SEQ, BATCH = 4, 4, 8, 2
WIDTH = N_HEADS * HEAD


def inputs():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, WIDTH), jnp.float32),
            jax.ShapeDtypeStruct((3, WIDTH, WIDTH), jnp.float32))


def slopes():
    return 2.0 ** (-8.0 * jnp.arange(1, N_HEADS + 1) / N_HEADS)


def _heads(t):
    return t.reshape(t.shape[0], t.shape[1], N_HEADS, HEAD)


def _alibi_attention(q, k, v, q_pos, k_pos):
    dist = (q_pos[:, None] - k_pos[None, :]).astype(jnp.float32)       # [q, k]
    bias = -slopes()[:, None, None] * dist                              # [h, q, k]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HEAD ** -0.5 + bias
    s = jnp.where(dist >= 0, s, -jnp.inf)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return o.reshape(o.shape[0], o.shape[1], WIDTH)


def alibi_attention(x, w_qkv):
    pos = jnp.arange(SEQ)
    q, k, v = (_heads(x @ w_qkv[i]) for i in range(3))
    return _alibi_attention(q, k, v, pos, pos)


def alibi_attention_sp(x, w_qkv, mesh):
    def body(xs, w_qkv):
        n_q = xs.shape[1]
        x_full = lax.all_gather(xs, "sp", axis=1, tiled=True)
        q = _heads(xs @ w_qkv[0])
        k, v = _heads(x_full @ w_qkv[1]), _heads(x_full @ w_qkv[2])
        q_pos = lax.axis_index("sp") * n_q + lax.iota(jnp.int32, n_q)
        return _alibi_attention(q, k, v, q_pos, lax.iota(jnp.int32, SEQ))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sp"), P()),
                         out_specs=P(None, "sp"))(x, w_qkv)


def alibi_attention_sp_strided(x, w_qkv, mesh):
    def body(xs, w_qkv):
        n_q = xs.shape[1]
        x_full = lax.all_gather(xs, "sp", axis=1, tiled=True)
        q = _heads(xs @ w_qkv[0])
        k, v = _heads(x_full @ w_qkv[1]), _heads(x_full @ w_qkv[2])
        q_pos = lax.axis_index("sp") + lax.iota(jnp.int32, n_q) * lax.axis_size("sp")
        return _alibi_attention(q, k, v, q_pos, lax.iota(jnp.int32, SEQ))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sp"), P()),
                         out_specs=P(None, "sp"))(x, w_qkv)
