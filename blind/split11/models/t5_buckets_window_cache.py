"""Position handling written the way inference stacks do it.

1. T5 encoder self-attention with bidirectional relative-position buckets (exact buckets for
   short distances, log-spaced up to max_distance) and a learned [buckets, heads] bias table.
   Queries are split over {q: 4}: each rank cuts its query rows out of the replicated input and
   builds the relative positions from its global query positions.
2. Sliding-window decode step: a chunk of new tokens written into a [B, S, H, HD] KV cache at an
   integer `start`, attention over the cache restricted to the last W positions (causal); heads
   sharded over {kv: 2}. Returns the block output and the updated cache.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD = 2, 16, 16, 4, 4
NUM_BUCKETS, MAX_DISTANCE = 16, 32


def relative_bucket(rel):
    """rel = key_position - query_position (int32) -> bucket id in [0, NUM_BUCKETS)."""
    half = NUM_BUCKETS // 2
    bucket = jnp.where(rel > 0, half, 0)
    n = jnp.abs(rel)
    max_exact = half // 2
    scaled = jnp.log(jnp.maximum(n, max_exact).astype(jnp.float32) / max_exact)
    scaled = scaled / jnp.log(MAX_DISTANCE / max_exact) * (half - max_exact)
    large = jnp.minimum(max_exact + scaled.astype(jnp.int32), half - 1)
    return bucket + jnp.where(n < max_exact, n, large)


def t5_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return ({"q": f(D, H, HD), "k": f(D, H, HD), "v": f(D, H, HD), "o": f(H, HD, D),
             "rel_bias": f(NUM_BUCKETS, H)}, f(B, T, D))


def _attend_with_bias(p, xq, xkv, bias):
    q = jnp.einsum("bqd,dhe->bqhe", xq, p["q"])
    k = jnp.einsum("bkd,dhe->bkhe", xkv, p["k"])
    v = jnp.einsum("bkd,dhe->bkhe", xkv, p["v"])
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) + bias           # T5: no 1/sqrt(d) scaling
    return jnp.einsum("bhqk,bkhe,hed->bqd", jax.nn.softmax(s, axis=-1), v, p["o"])


def t5_self_attention(params, x):
    pos = jnp.arange(T)
    rel = pos[None, :] - pos[:, None]
    bias = jnp.transpose(params["rel_bias"][relative_bucket(rel)], (2, 0, 1))
    return x + _attend_with_bias(params, x, x, bias)


def _t5_query_shard(params, x):
    t_local = T // lax.axis_size("q")
    q_start = lax.axis_index("q") * t_local
    xq = lax.dynamic_slice_in_dim(x, q_start, t_local, axis=1)
    q_pos = q_start + jnp.arange(t_local)
    k_pos = jnp.arange(x.shape[1])
    rel = k_pos[None, :] - q_pos[:, None]
    bias = jnp.moveaxis(jnp.take(params["rel_bias"], relative_bucket(rel), axis=0), -1, 0)
    return xq + _attend_with_bias(params, xq, x, bias)


def _t5_query_shard_rel_flipped(params, x):
    t_local = T // lax.axis_size("q")
    q_start = lax.axis_index("q") * t_local
    xq = lax.dynamic_slice_in_dim(x, q_start, t_local, axis=1)
    q_pos = q_start + jnp.arange(t_local)
    k_pos = jnp.arange(x.shape[1])
    rel = q_pos[:, None] - k_pos[None, :]
    bias = jnp.moveaxis(jnp.take(params["rel_bias"], relative_bucket(rel), axis=0), -1, 0)
    return xq + _attend_with_bias(params, xq, x, bias)


def t5_self_attention_q_sharded(params, x, mesh):
    return jax.shard_map(_t5_query_shard, mesh=mesh, in_specs=(P(), P()),
                         out_specs=P(None, "q"))(params, x)


def t5_self_attention_q_sharded_rel_flipped(params, x, mesh):
    return jax.shard_map(_t5_query_shard_rel_flipped, mesh=mesh, in_specs=(P(), P()),
                         out_specs=P(None, "q"))(params, x)


# ---- sliding-window decode into a KV cache ------------------------------------------------------

S, TN, W = 16, 4, 6


def decode_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"q": f(D, H, HD), "k": f(D, H, HD), "v": f(D, H, HD), "o": f(H, HD, D)}
    cache = {"k": f(B, S, H, HD), "v": f(B, S, H, HD)}
    return params, cache, f(B, TN, D), jax.ShapeDtypeStruct((), jnp.int32)


def window_decode(params, cache, x, start):
    q = jnp.einsum("btd,dhe->bthe", x, params["q"])
    k = lax.dynamic_update_slice(cache["k"], jnp.einsum("btd,dhe->bthe", x, params["k"]),
                                 (0, start, 0, 0))
    v = lax.dynamic_update_slice(cache["v"], jnp.einsum("btd,dhe->bthe", x, params["v"]),
                                 (0, start, 0, 0))
    q_pos = start + jnp.arange(TN)
    k_pos = jnp.arange(S)
    visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - W)
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(float(HD))
    s = jnp.where(visible, s, -jnp.inf)
    ctx = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    return x + jnp.einsum("bqhe,hed->bqd", ctx, params["o"]), {"k": k, "v": v}


def _window_decode_heads(params, cache, x, start):
    def project(name):
        return jnp.einsum("btd,dhe->bthe", x, params[name])

    k = lax.dynamic_update_slice_in_dim(cache["k"], project("k"), start, axis=1)
    v = lax.dynamic_update_slice_in_dim(cache["v"], project("v"), start, axis=1)
    dist = (start + jnp.arange(x.shape[1]))[:, None] - jnp.arange(k.shape[1])[None, :]
    visible = (dist >= 0) & (dist < W)
    s = jnp.einsum("bqhe,bkhe->bhqk", project("q") * HD ** -0.5, k)
    s = jnp.where(visible, s, -jnp.inf)
    ctx = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    out = lax.psum(jnp.einsum("bqhe,hed->bqd", ctx, params["o"]), "kv")
    return x + out, {"k": k, "v": v}


def _window_decode_heads_wide(params, cache, x, start):
    def project(name):
        return jnp.einsum("btd,dhe->bthe", x, params[name])

    k = lax.dynamic_update_slice_in_dim(cache["k"], project("k"), start, axis=1)
    v = lax.dynamic_update_slice_in_dim(cache["v"], project("v"), start, axis=1)
    dist = (start + jnp.arange(x.shape[1]))[:, None] - jnp.arange(k.shape[1])[None, :]
    visible = (dist >= 0) & (dist <= W)
    s = jnp.einsum("bqhe,bkhe->bhqk", project("q") * HD ** -0.5, k)
    s = jnp.where(visible, s, -jnp.inf)
    ctx = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    out = lax.psum(jnp.einsum("bqhe,hed->bqd", ctx, params["o"]), "kv")
    return x + out, {"k": k, "v": v}


_DECODE_SPECS = ({"q": P(None, "kv"), "k": P(None, "kv"), "v": P(None, "kv"), "o": P("kv")},
                 {"k": P(None, None, "kv"), "v": P(None, None, "kv")}, P(), P())
_DECODE_OUT = (P(), {"k": P(None, None, "kv"), "v": P(None, None, "kv")})


def window_decode_heads(params, cache, x, start, mesh):
    return jax.shard_map(_window_decode_heads, mesh=mesh, in_specs=_DECODE_SPECS,
                         out_specs=_DECODE_OUT)(params, cache, x, start)


def window_decode_heads_wide(params, cache, x, start, mesh):
    return jax.shard_map(_window_decode_heads_wide, mesh=mesh, in_specs=_DECODE_SPECS,
                         out_specs=_DECODE_OUT)(params, cache, x, start)
