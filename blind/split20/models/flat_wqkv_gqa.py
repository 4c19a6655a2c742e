"""GQA attention (8 query heads, 2 kv heads, causal) whose projection is one flat matrix
w_qkv [D, (H + 2*KV) * HD] laid out [all q heads | all k heads | all v heads], with a bias.

- `gqa_column_offsets`: shard_map on {tp: 4}; the flat matrix is replicated and every rank cuts its
  two query heads and the kv head of its group at column offsets computed from `axis_index`;
- `gqa_repacked`: on {dp: 2, tp: 2}; the caller repacks the columns into per-rank blocks
  [tp, D, (H/tp + 2*KV/tp) * HD] that are sharded over tp.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, KV, HD = 2, 8, 32, 8, 2, 4
R = H // KV


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, (H + 2 * KV) * HD), f((H + 2 * KV) * HD), f(H * HD, D), f(B, T, D)


def _attend(q, k, v):
    # q [b, t, g, r, hd], k/v [b, t, g, hd]
    s = jnp.einsum("bqgrh,bkgh->bgrqk", q, k) / jnp.sqrt(HD).astype(q.dtype)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    return jnp.einsum("bgrqk,bkgh->bqgrh", jax.nn.softmax(s, -1), v)


def gqa(w_qkv, b_qkv, w_o, x):
    y = x @ w_qkv + b_qkv
    q = y[..., :H * HD].reshape(B, T, KV, R, HD)
    k = y[..., H * HD:(H + KV) * HD].reshape(B, T, KV, HD)
    v = y[..., (H + KV) * HD:].reshape(B, T, KV, HD)
    return _attend(q, k, v).reshape(B, T, H * HD) @ w_o


# ---- column offsets from axis_index -------------------------------------------------------------

def _cut(w, b, start, width):
    return (lax.dynamic_slice_in_dim(w, start, width, axis=1),
            lax.dynamic_slice_in_dim(b, start, width, axis=0))


def _offsets_local(w_qkv, b_qkv, w_o, x, k_start):
    r = lax.axis_index("tp")
    hq = H // lax.axis_size("tp")
    g = r * hq // R
    wq, bq = _cut(w_qkv, b_qkv, r * hq * HD, hq * HD)
    wk, bk = _cut(w_qkv, b_qkv, k_start(g), HD)
    wv, bv = _cut(w_qkv, b_qkv, (H + KV) * HD + g * HD, HD)
    bsz, t = x.shape[:2]
    q = (x @ wq + bq).reshape(bsz, t, 1, hq, HD)
    k = (x @ wk + bk).reshape(bsz, t, 1, HD)
    v = (x @ wv + bv).reshape(bsz, t, 1, HD)
    o = _attend(q, k, v).reshape(bsz, t, hq * HD)
    return lax.psum(o @ w_o, "tp")


def _k_start(g):
    return H * HD + g * HD


def _k_start_missing_base(g):
    return g * HD


def _run_offsets(w_qkv, b_qkv, w_o, x, mesh, k_start):
    local = lambda w, b, wo, x: _offsets_local(w, b, wo, x, k_start)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("tp"), P()), out_specs=P(),
                         check_vma=False)(w_qkv, b_qkv, w_o, x)


def gqa_column_offsets(w_qkv, b_qkv, w_o, x, mesh):
    return _run_offsets(w_qkv, b_qkv, w_o, x, mesh, _k_start)


def gqa_column_offsets_k_from_q(w_qkv, b_qkv, w_o, x, mesh):
    return _run_offsets(w_qkv, b_qkv, w_o, x, mesh, _k_start_missing_base)


# ---- per-rank repacked blocks --------------------------------------------------------------------

def _repack(a, tp):
    """[..., (H + 2KV) * HD] -> [tp, ..., cols] with rank r's q heads, then its k, then its v."""
    lead = a.shape[:-1]
    q = a[..., :H * HD].reshape(*lead, tp, H // tp * HD)
    k = a[..., H * HD:(H + KV) * HD].reshape(*lead, tp, KV // tp * HD)
    v = a[..., (H + KV) * HD:].reshape(*lead, tp, KV // tp * HD)
    return jnp.moveaxis(jnp.concatenate((q, k, v), axis=-1), -2, 0)


def _bias_split_evenly(b, tp):
    return b.reshape(tp, -1)


def _repacked_local(w, b, w_o, x):
    w, b = w[0], b[0]
    hq = w_o.shape[0] // HD
    kv = (w.shape[-1] // HD - hq) // 2
    bsz, t = x.shape[:2]
    y = x @ w + b
    q = y[..., :hq * HD].reshape(bsz, t, kv, hq // kv, HD)
    k = y[..., hq * HD:(hq + kv) * HD].reshape(bsz, t, kv, HD)
    v = y[..., (hq + kv) * HD:].reshape(bsz, t, kv, HD)
    o = _attend(q, k, v).reshape(bsz, t, hq * HD)
    return lax.psum(o @ w_o, "tp")


def _run_repacked(w_qkv, b_qkv, w_o, x, mesh, repack_bias):
    tp = mesh.shape["tp"]
    w, b = _repack(w_qkv, tp), repack_bias(b_qkv, tp)
    return jax.shard_map(_repacked_local, mesh=mesh, in_specs=(P("tp"), P("tp"), P("tp"), P("dp")),
                         out_specs=P("dp"), check_vma=False)(w, b, w_o, x)


def gqa_repacked(w_qkv, b_qkv, w_o, x, mesh):
    return _run_repacked(w_qkv, b_qkv, w_o, x, mesh, _repack)


def gqa_repacked_bias_not_repacked(w_qkv, b_qkv, w_o, x, mesh):
    return _run_repacked(w_qkv, b_qkv, w_o, x, mesh, _bias_split_evenly)
