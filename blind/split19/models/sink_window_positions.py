"""StreamingLLM-style attention without position embeddings (NoPE): a causal sliding window of W
keys plus the first SINKS tokens ("attention sinks"), which every query may always see. The mask
is built from integer positions, so a query chunk must know where it starts.

Queries are split over the sequence, keys and values stay whole:
- `sink_attention_sp`: on {sp: 4}, query positions are `axis_index * chunk + arange(chunk)`;
- `sink_attention_dp_sp`: on {dp: 2, sp: 2}, batch over dp, positions from `lax.iota` plus the
  offset, the window written as `k_pos > q_pos - W`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, W, SINKS = 2, 16, 32, 4, 8, 4, 2


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, H * HD), f(D, H * HD), f(D, H * HD), f(H * HD, D), f(B, T, D)


def _visible(q_pos, k_pos):
    q, k = q_pos[:, None], k_pos[None, :]
    return (k <= q) & ((q - k < W) | (k < SINKS))


def _attend(xq, x, wq, wk, wv, wo, mask):
    heads = lambda t: t.reshape(t.shape[0], t.shape[1], H, HD)
    q, k, v = heads(xq @ wq), heads(x @ wk), heads(x @ wv)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(HD))
    s = jnp.where(mask, s, -1e30)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return o.reshape(o.shape[0], o.shape[1], H * HD) @ wo


def sink_attention(wq, wk, wv, wo, x):
    pos = jnp.arange(T)
    return _attend(x, x, wq, wk, wv, wo, _visible(pos, pos))


# ---- query chunks over sp -----------------------------------------------------------------------

def _sp_local(wq, wk, wv, wo, xq, x):
    chunk = xq.shape[1]
    q_pos = lax.axis_index("sp") * chunk + jnp.arange(chunk)
    return _attend(xq, x, wq, wk, wv, wo, _visible(q_pos, jnp.arange(T)))


def _sp_local_unscaled_offset(wq, wk, wv, wo, xq, x):
    chunk = xq.shape[1]
    q_pos = lax.axis_index("sp") + jnp.arange(chunk)
    return _attend(xq, x, wq, wk, wv, wo, _visible(q_pos, jnp.arange(T)))


def _sp(local, wq, wk, wv, wo, x, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), P(), P(None, "sp"), P()),
                         out_specs=P(None, "sp"), check_vma=False)(wq, wk, wv, wo, x, x)


def sink_attention_sp(wq, wk, wv, wo, x, mesh):
    return _sp(_sp_local, wq, wk, wv, wo, x, mesh)


def sink_attention_sp_unscaled_offset(wq, wk, wv, wo, x, mesh):
    return _sp(_sp_local_unscaled_offset, wq, wk, wv, wo, x, mesh)


# ---- batch over dp, query chunks over sp, window written the other way --------------------------

def _window_mask(q_pos, k_pos):
    q, k = q_pos[:, None], k_pos[None, :]
    return (k <= q) & ((k > q - W) | (k < SINKS))


def _window_mask_one_wider(q_pos, k_pos):
    q, k = q_pos[:, None], k_pos[None, :]
    return (k <= q) & ((k >= q - W) | (k < SINKS))


def _dp_sp_local(wq, wk, wv, wo, xq, x, mask_fn):
    chunk = xq.shape[1]
    q_pos = lax.iota(jnp.int32, chunk) + chunk * lax.axis_index("sp")
    k_pos = lax.iota(jnp.int32, x.shape[1])
    return _attend(xq, x, wq, wk, wv, wo, mask_fn(q_pos, k_pos))


def _dp_sp(mask_fn, wq, wk, wv, wo, x, mesh):
    local = lambda *a: _dp_sp_local(*a, mask_fn)
    return jax.shard_map(local, mesh=mesh,
                         in_specs=(P(), P(), P(), P(), P("dp", "sp"), P("dp")),
                         out_specs=P("dp", "sp"), check_vma=False)(wq, wk, wv, wo, x, x)


def sink_attention_dp_sp(wq, wk, wv, wo, x, mesh):
    return _dp_sp(_window_mask, wq, wk, wv, wo, x, mesh)


def sink_attention_dp_sp_window_one_wider(wq, wk, wv, wo, x, mesh):
    return _dp_sp(_window_mask_one_wider, wq, wk, wv, wo, x, mesh)
