"""Positions computed from data, two serving/training patterns.

1. Packed sequences: several documents share a row, `segment_ids` mark them. A token's position is
   its offset from the start of its segment (a segment starts where the id changes), read from a
   learned position table; attention is causal within equal segment ids. Sequence-parallel over
   {seq: 4}: a shard learns the id of the token before its first one with `lax.ppermute`, and the
   start of a segment that began on an earlier shard from an all-gather of every shard's last start.
2. Decode with a ring-buffer KV cache of W slots (slot = position mod W, written with
   dynamic_update_slice), per-example positions; a slot is valid once written. Heads sharded
   over {tp: 2}, the ring arithmetic written with bit masks.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D = 2, 16, 16
N_SEG = 3


def packed_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    w = {"pos_emb": f(S, D), "wq": f(D, D), "wk": f(D, D), "wv": f(D, D)}
    return w, f(B, S, D), jax.ShapeDtypeStruct((B, S), jnp.int32)


def _segment_positions(seg):
    prev = jnp.concatenate([jnp.full((seg.shape[0], 1), -1, seg.dtype), seg[:, :-1]], axis=1)
    t = jnp.arange(seg.shape[1])
    last_start = lax.cummax(jnp.where(seg != prev, t, 0), axis=1)
    return t - last_start


def _packed_attention(q, k, v, seg_q, seg_k, t_q, t_k):
    allowed = (seg_q[:, :, None] == seg_k[:, None, :]) & (t_q[:, None] >= t_k[None, :])
    scores = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(float(D))
    return jax.nn.softmax(jnp.where(allowed, scores, -1e30), axis=-1) @ v


def packed_layer(w, x, seg):
    h = x + w["pos_emb"][_segment_positions(seg)]
    t = jnp.arange(S)
    return _packed_attention(h @ w["wq"], h @ w["wk"], h @ w["wv"], seg, seg, t, t)


def _earlier_shards(n, i):
    return jnp.arange(n) < i


def _earlier_or_same(n, i):
    return jnp.arange(n) <= i


def _packed_local(w, x, seg, shards_before):
    n, i = lax.axis_size("seq"), lax.axis_index("seq")
    local = seg.shape[1]
    t = i * local + jnp.arange(local)
    from_prev = lax.ppermute(seg[:, -1], "seq", [(j, j + 1) for j in range(n - 1)])
    first_prev = jnp.where(i == 0, -1, from_prev)
    prev = jnp.concatenate([first_prev[:, None], seg[:, :-1]], axis=1)
    starts = jnp.where(seg != prev, t, -1)
    last_each = lax.all_gather(jnp.max(starts, axis=1), "seq")                  # [n, B]
    carried = jnp.max(jnp.where(shards_before(n, i)[:, None], last_each, -1), axis=0)
    pos = t - jnp.maximum(lax.cummax(starts, axis=1), carried[:, None])
    h = x + jnp.take(w["pos_emb"], pos, axis=0)
    gather = lambda a: lax.all_gather(a, "seq", axis=1, tiled=True)
    return _packed_attention(h @ w["wq"], gather(h @ w["wk"]), gather(h @ w["wv"]), seg,
                             gather(seg), t, jnp.arange(S))


def _packed_sp(w, x, seg, mesh, shards_before):
    fn = jax.shard_map(lambda w, x, s: _packed_local(w, x, s, shards_before), mesh=mesh,
                       in_specs=(P(), P(None, "seq"), P(None, "seq")), out_specs=P(None, "seq"))
    return fn(w, x, seg)


def packed_layer_sp(w, x, seg, mesh):
    return _packed_sp(w, x, seg, mesh, _earlier_shards)


def packed_layer_sp_own_shard(w, x, seg, mesh):
    return _packed_sp(w, x, seg, mesh, _earlier_or_same)


# ---- 2. ring-buffer KV cache decode ---------------------------------------------------------------

RB, H, HD, W = 4, 4, 8, 8


def ring_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    w = {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}
    return w, f(RB, D), f(RB, W, H, HD), f(RB, W, H, HD), jax.ShapeDtypeStruct((RB,), jnp.int32)


def ring_decode(w, x, cache_k, cache_v, pos):
    q, k, v = (jnp.einsum("bd,dhk->bhk", x, w[n]) for n in ("wq", "wk", "wv"))
    slot = pos % W
    cache_k = cache_k.at[jnp.arange(RB), slot].set(k)
    cache_v = cache_v.at[jnp.arange(RB), slot].set(v)
    slot_pos = pos[:, None] - (pos[:, None] - jnp.arange(W)[None, :]) % W
    scores = jnp.einsum("bhk,bshk->bhs", q, cache_k) / jnp.sqrt(float(HD))
    scores = jnp.where((slot_pos >= 0)[:, None, :], scores, -1e30)
    ctx = jnp.einsum("bhs,bshk->bhk", jax.nn.softmax(scores, axis=-1), cache_v)
    return jnp.einsum("bhk,hkd->bd", ctx, w["wo"]), cache_k, cache_v


def _written(slots, pos):
    return (slots <= pos[:, None]) | (pos[:, None] >= W - 1)


def _written_strict(slots, pos):
    return (slots < pos[:, None]) | (pos[:, None] >= W - 1)


def _ring_local(w, x, cache_k, cache_v, pos, written):
    q, k, v = (jnp.einsum("bd,dhk->bhk", x, w[n]) for n in ("wq", "wk", "wv"))
    slot = jnp.bitwise_and(pos, W - 1)
    put = jax.vmap(lambda c, new, s: lax.dynamic_update_slice(c, new[None], (s, 0, 0)))
    cache_k, cache_v = put(cache_k, k, slot), put(cache_v, v, slot)
    valid = written(jnp.arange(W)[None, :], pos)
    scores = jnp.einsum("bhk,bshk->bhs", q, cache_k) * HD ** -0.5
    probs = jax.nn.softmax(jnp.where(valid[:, None, :], scores, -1e30), axis=-1)
    ctx = jnp.einsum("bhs,bshk->bhk", probs, cache_v)
    return lax.psum(jnp.einsum("bhk,hkd->bd", ctx, w["wo"]), "tp"), cache_k, cache_v


def _ring_tp(w, x, cache_k, cache_v, pos, mesh, written):
    specs = {"wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp")}
    heads = P(None, None, "tp")
    fn = jax.shard_map(lambda *a: _ring_local(*a, written=written), mesh=mesh,
                       in_specs=(specs, P(), heads, heads, P()), out_specs=(P(), heads, heads))
    return fn(w, x, cache_k, cache_v, pos)


def ring_decode_tp(w, x, cache_k, cache_v, pos, mesh):
    return _ring_tp(w, x, cache_k, cache_v, pos, mesh, _written)


def ring_decode_tp_strict(w, x, cache_k, cache_v, pos, mesh):
    return _ring_tp(w, x, cache_k, cache_v, pos, mesh, _written_strict)
