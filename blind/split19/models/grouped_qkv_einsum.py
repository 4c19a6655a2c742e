"""Grouped-query attention whose fused kernel is stored per kv group: w_qkv has shape
[D, G, R + 2, HD] (for each of the G kv groups: its R query heads, then its key, then its value,
as in ChatGLM-style checkpoints), and all attention maths is `jnp.einsum` over the
(batch, time, group, rep, head_dim) axes "btgrh".

- `gqa_groups`: on {tp: 2}, one kv group per device, the fused kernel sharded on its group axis
  and split inside shard_map;
- `gqa_reps`: on {tp: 4}, the query heads of every group are split over tp (one per group per
  device) while the key/value slices are replicated.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, G, R, HD, B, T = 32, 2, 4, 8, 2, 8


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, G, R + 2, HD), f(G, R, HD, D), f(B, T, D)


def _attend(q, k, v, wo):
    s = jnp.einsum("btgrh,bsgh->bgrts", q, k) * (HD ** -0.5)
    t = q.shape[1]
    s = jnp.where(jnp.arange(t)[:, None] >= jnp.arange(t)[None, :], s, -jnp.inf)
    o = jnp.einsum("bgrts,bsgh->btgrh", jax.nn.softmax(s, axis=-1), v)
    return jnp.einsum("btgrh,grhd->btd", o, wo)


def gqa(w_qkv, wo, x):
    qkv = jnp.einsum("btd,dgch->btgch", x, w_qkv)
    return _attend(qkv[:, :, :, :R], qkv[:, :, :, R], qkv[:, :, :, R + 1], wo)


# ---- one kv group per device --------------------------------------------------------------------

def _groups_local(w_qkv, wo, x):
    qkv = jnp.einsum("btd,dgch->btgch", x, w_qkv)
    q = qkv[:, :, :, :R]
    k, v = qkv[:, :, :, R], qkv[:, :, :, R + 1]
    return lax.psum(_attend(q, k, v, wo), "tp")


def _groups_local_kv_swapped(w_qkv, wo, x):
    qkv = jnp.einsum("btd,dgch->btgch", x, w_qkv)
    q = qkv[:, :, :, :R]
    k, v = qkv[:, :, :, R + 1], qkv[:, :, :, R]
    return lax.psum(_attend(q, k, v, wo), "tp")


def _by_group(local, w_qkv, wo, x, mesh):
    return jax.shard_map(local, mesh=mesh,
                         in_specs=(P(None, "tp", None, None), P("tp", None, None, None), P()),
                         out_specs=P(), check_vma=False)(w_qkv, wo, x)


def gqa_groups(w_qkv, wo, x, mesh):
    return _by_group(_groups_local, w_qkv, wo, x, mesh)


def gqa_groups_kv_swapped(w_qkv, wo, x, mesh):
    return _by_group(_groups_local_kv_swapped, w_qkv, wo, x, mesh)


# ---- query heads of each group over tp, kv replicated ------------------------------------------

def _reps_local(wq, wkv, wo, x):
    q = jnp.einsum("btd,dgrh->btgrh", x, wq)
    kv = jnp.einsum("btd,dgch->btgch", x, wkv)
    return lax.psum(_attend(q, kv[:, :, :, 0], kv[:, :, :, 1], wo), "tp")


def _by_rep(wq, wkv, wo, x, mesh):
    return jax.shard_map(_reps_local, mesh=mesh,
                         in_specs=(P(None, None, "tp", None), P(), P(None, "tp", None, None), P()),
                         out_specs=P(), check_vma=False)(wq, wkv, wo, x)


def gqa_reps(w_qkv, wo, x, mesh):
    wq, wkv = w_qkv[:, :, :R], w_qkv[:, :, R:R + 2]
    return _by_rep(wq, wkv, wo, x, mesh)


def gqa_reps_kv_window_off_by_one(w_qkv, wo, x, mesh):
    wq, wkv = w_qkv[:, :, :R], w_qkv[:, :, R - 1:R + 1]
    return _by_rep(wq, wkv, wo, x, mesh)
