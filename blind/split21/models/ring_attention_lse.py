"""Ring attention over a sequence-parallel axis: every rank keeps its query chunk, the key/value
chunks travel around the ring with ppermute inside a `lax.fori_loop`, and the partial results are
merged with the online-softmax (running max, running denominator) rule.

- `ring_causal`: causal attention on {sp: 4}; the mask compares global positions of the query
  chunk and of the key chunk currently held (which came from rank `me - step`);
- `ring_padded`: bidirectional attention with per-sequence key lengths (int input) on {sp: 4}.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, H, T, HD = 2, 2, 16, 8
NEG = -1e30


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(B, H, T, HD), f(B, H, T, HD), f(B, H, T, HD), jax.ShapeDtypeStruct((B,), jnp.int32)


def _attention(q, k, v, allowed):
    s = jnp.where(allowed, jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(HD), NEG)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1), v)


def causal(q, k, v, lengths):
    del lengths
    return _attention(q, k, v, jnp.tril(jnp.ones((T, T), bool)))


def padded(q, k, v, lengths):
    return _attention(q, k, v, (jnp.arange(T)[None, :] < lengths[:, None])[:, None, None, :])


def _merge(carry, s, allowed, v):
    o, l, m = carry
    s = jnp.where(allowed, s, NEG)
    m_new = jnp.maximum(m, s.max(-1))
    corr = jnp.exp(m - m_new)
    p = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
    return o * corr[..., None] + jnp.einsum("bhqk,bhkd->bhqd", p, v), l * corr + p.sum(-1), m_new


def _merge_denominator_not_rescaled(carry, s, allowed, v):
    o, l, m = carry
    s = jnp.where(allowed, s, NEG)
    m_new = jnp.maximum(m, s.max(-1))
    corr = jnp.exp(m - m_new)
    p = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
    return o * corr[..., None] + jnp.einsum("bhqk,bhkd->bhqd", p, v), l + p.sum(-1), m_new


def _ring(q, k, v, lengths, mask_fn, merge):
    n, me = lax.axis_size("sp"), lax.axis_index("sp")
    c = q.shape[2]
    perm = [(i, (i + 1) % n) for i in range(n)]
    zeros = jnp.zeros(q.shape[:3], q.dtype)

    def step(i, state):
        o, l, m, k, v = state
        allowed = mask_fn(me, i, n, c, lengths)
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(HD)
        o, l, m = merge((o, l, m), s, allowed, v)
        return o, l, m, lax.ppermute(k, "sp", perm), lax.ppermute(v, "sp", perm)

    o, l, _, _, _ = lax.fori_loop(0, n, step, (jnp.zeros_like(q), zeros, zeros + NEG, k, v))
    return o / l[..., None]


def _causal_mask(me, i, n, c, lengths):
    src = (me - i) % n
    qpos = me * c + jnp.arange(c)
    kpos = src * c + jnp.arange(c)
    return kpos[None, :] <= qpos[:, None]


def _causal_mask_wrong_source(me, i, n, c, lengths):
    src = (me + i) % n
    qpos = me * c + jnp.arange(c)
    kpos = src * c + jnp.arange(c)
    return kpos[None, :] <= qpos[:, None]


def _padding_mask(me, i, n, c, lengths):
    kpos = ((me - i) % n) * c + jnp.arange(c)
    return (kpos[None, :] < lengths[:, None])[:, None, None, :]


SEQ = P(None, None, "sp")


def _run(q, k, v, lengths, mesh, mask_fn, merge):
    local = lambda q, k, v, lengths: _ring(q, k, v, lengths, mask_fn, merge)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(SEQ, SEQ, SEQ, P()), out_specs=SEQ)(q, k, v, lengths)


def ring_causal(q, k, v, lengths, mesh):
    return _run(q, k, v, lengths, mesh, _causal_mask, _merge)


def ring_causal_wrong_source(q, k, v, lengths, mesh):
    return _run(q, k, v, lengths, mesh, _causal_mask_wrong_source, _merge)


def ring_padded(q, k, v, lengths, mesh):
    return _run(q, k, v, lengths, mesh, _padding_mask, _merge)


def ring_padded_denominator_not_rescaled(q, k, v, lengths, mesh):
    return _run(q, k, v, lengths, mesh, _padding_mask, _merge_denominator_not_rescaled)
