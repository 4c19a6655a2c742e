"""Causal sliding-window attention with ALiBi biases; queries sharded over the sequence (`sp`),
keys/values all-gathered. Absolute positions come from iota plus the shard's offset.
"""
import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

HEADS, HEAD_DIM, WINDOW = 4, 8, 5
SLOPES = jnp.asarray(2.0 ** (-8.0 * np.arange(1, HEADS + 1) / HEADS), jnp.float32)


def alibi_args():
    t = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return t(2, 16, HEADS, HEAD_DIM), t(2, 16, HEADS, HEAD_DIM), t(2, 16, HEADS, HEAD_DIM)


def alibi_attention(q, k, v):
    n = q.shape[1]
    qi, kj = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    dist = (qi - kj).astype(jnp.float32)
    allowed = (kj <= qi) & (qi - kj < WINDOW)
    logits = jnp.einsum("...qhd,...khd->...hqk", q, k) / np.sqrt(HEAD_DIM)
    logits = logits - SLOPES[:, None, None] * dist
    logits = jnp.where(allowed, logits, -1e30)
    return jnp.einsum("...hqk,...khd->...qhd", jax.nn.softmax(logits, axis=-1), v)


def _block_positions(n_local):
    offset = jax.lax.axis_index("sp") * n_local
    return jax.lax.broadcasted_iota(jnp.int32, (n_local, 1), 0) + offset


def _block_positions_v2(n_local):
    return jax.lax.broadcasted_iota(jnp.int32, (n_local, 1), 0) + jax.lax.axis_index("sp")


def _local_attn(q_blk, k_blk, v_blk, positions=_block_positions):
    k = jax.lax.all_gather(k_blk, "sp", axis=1, tiled=True)
    v = jax.lax.all_gather(v_blk, "sp", axis=1, tiled=True)
    n_local, n = q_blk.shape[1], k.shape[1]
    q_pos = positions(n_local)
    k_pos = jax.lax.broadcasted_iota(jnp.int32, (1, n), 1)
    rel = q_pos - k_pos
    bias = -SLOPES[:, None, None] * rel.astype(jnp.float32)
    mask = (rel >= 0) & (rel < WINDOW)
    s = jnp.einsum("bqhd,bkhd->bhqk", q_blk, k) * (HEAD_DIM ** -0.5) + bias
    p = jax.nn.softmax(jnp.where(mask[None, None], s, -1e30), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def alibi_attention_sp(q, k, v, mesh):
    spec = P(None, "sp")
    return jax.shard_map(_local_attn, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)


def alibi_attention_sp_v2(q, k, v, mesh):
    spec = P(None, "sp")
    body = lambda q, k, v: _local_attn(q, k, v, _block_positions_v2)
    return jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)
