"""Causal attention with ALiBi biases; queries split along the sequence, keys/values replicated."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, SEQ, HEADS, HD = 2, 16, 4, 4


def alibi_slopes(n_heads):
    return 2.0 ** (-8.0 * jnp.arange(1, n_heads + 1) / n_heads)


def _alibi_attend(q, k, v, q_pos, k_pos):
    rel = (k_pos[None, :] - q_pos[:, None]).astype(jnp.float32)
    bias = alibi_slopes(HEADS)[:, None, None] * rel[None]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(HD)) + bias
    s = jnp.where(k_pos[None, :] <= q_pos[:, None], s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def alibi_attention(q, k, v):
    pos = jnp.arange(SEQ)
    return _alibi_attend(q, k, v, pos, pos)


def alibi_inputs():
    s = jax.ShapeDtypeStruct((B, SEQ, HEADS, HD), jnp.float32)
    return s, s, s


def alibi_attention_sp(q, k, v):
    def body(q_blk, k_all, v_all):
        n = q_blk.shape[1]
        q_pos = lax.axis_index("sp") * n + jnp.arange(n)
        return _alibi_attend(q_blk, k_all, v_all, q_pos, jnp.arange(SEQ))

    return jax.shard_map(body, in_specs=(P(None, "sp"), P(), P()), out_specs=P(None, "sp"))(q, k, v)


def alibi_attention_sp_v2(q, k, v):
    def body(q_blk, k_all, v_all):
        n = q_blk.shape[1]
        q_pos = lax.axis_index("sp") * SEQ // n + jnp.arange(n)
        return _alibi_attend(q_blk, k_all, v_all, q_pos, jnp.arange(SEQ))

    return jax.shard_map(body, in_specs=(P(None, "sp"), P(), P()), out_specs=P(None, "sp"))(q, k, v)
