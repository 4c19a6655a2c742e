"""Bidirectional attention over a long sequence; the distributed version is ring attention."""
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, L, NH, DH = 1, 16, 2, 8


def full_attention(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * DH ** -0.5
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def qkv_shapes():
    spec = jax.ShapeDtypeStruct((B, L, NH, DH), jnp.float32)
    return spec, spec, spec


def _ring_step(q, carry, rescale):
    acc, row_max, denom, k, v = carry
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * DH ** -0.5
    new_max = jnp.maximum(row_max, s.max(-1))
    p = jnp.exp(s - new_max[..., None])
    alpha = jnp.exp(row_max - new_max)
    pv = jnp.einsum("bhqk,bkhd->bhqd", p, v)
    if rescale:
        acc = acc * alpha[..., None] + pv
    else:
        acc = acc + pv
    denom = denom * alpha + p.sum(-1)
    n = lax.axis_size("ring")
    perm = [(j, (j + 1) % n) for j in range(n)]
    k = lax.ppermute(k, "ring", perm)
    v = lax.ppermute(v, "ring", perm)
    return acc, new_max, denom, k, v


def _ring_local(q, k, v, rescale):
    b, lq, h, d = q.shape
    acc = jnp.zeros((b, h, lq, d), q.dtype)
    row_max = jnp.full((b, h, lq), -jnp.inf, q.dtype)
    denom = jnp.zeros((b, h, lq), q.dtype)
    carry = (acc, row_max, denom, k, v)
    carry = lax.fori_loop(0, lax.axis_size("ring"),
                          lambda _, c: _ring_step(q, c, rescale), carry)
    acc, _, denom, _, _ = carry
    return (acc / denom[..., None]).transpose(0, 2, 1, 3)


def ring_attention(q, k, v):
    seq = P(None, "ring")
    return jax.shard_map(partial(_ring_local, rescale=True), in_specs=(seq, seq, seq),
                         out_specs=seq, check_vma=False)(q, k, v)


def ring_attention_fast(q, k, v):
    seq = P(None, "ring")
    return jax.shard_map(partial(_ring_local, rescale=False), in_specs=(seq, seq, seq),
                         out_specs=seq, check_vma=False)(q, k, v)
