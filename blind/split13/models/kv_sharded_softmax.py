"""Causal self-attention over a sequence sharded on {cp: 4}, with projections (replicated weights)
and an output projection. Two sequence-parallel styles:

- `attention_gather_kv`: each device keeps its query block, all-gathers K and V (tiled, along the
  sequence) and masks with global positions `axis_index * S_LOCAL + iota`;
- `attention_sharded_softmax`: queries are all-gathered and every device scores all queries
  against its own key block; the softmax is assembled across devices - row maximum by `pmax`,
  numerator and denominator by `psum` - and each device keeps its query rows by
  `lax.dynamic_slice_in_dim`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 32, 4, 8
AXIS = "cp"
N = 4
S_LOCAL = S // N
NEG = -1e30


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    w = {"wq": f(D, H * HD), "wk": f(D, H * HD), "wv": f(D, H * HD), "wo": f(H * HD, D)}
    return w, f(B, S, D)


def _heads(t):
    return t.reshape(*t.shape[:-1], H, HD)


def _qkv(w, x):
    return _heads(x @ w["wq"]), _heads(x @ w["wk"]), _heads(x @ w["wv"])


def _merge(o, w):
    return o.reshape(*o.shape[:-2], H * HD) @ w["wo"]


def attention(w, x):
    q, k, v = _qkv(w, x)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    pos = jnp.arange(S)
    s = jnp.where(pos[:, None] >= pos[None, :], s, NEG)
    return _merge(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v), w)


# ---- gather K/V --------------------------------------------------------------------------------

def _gather_kv_local(w, x):
    q, k, v = _qkv(w, x)
    k = lax.all_gather(k, AXIS, axis=1, tiled=True)
    v = lax.all_gather(v, AXIS, axis=1, tiled=True)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    q_pos = lax.axis_index(AXIS) * S_LOCAL + jnp.arange(S_LOCAL)
    k_pos = jnp.arange(S)
    s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
    return _merge(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v), w)


def _gather_kv_local_strict(w, x):
    q, k, v = _qkv(w, x)
    k = lax.all_gather(k, AXIS, axis=1, tiled=True)
    v = lax.all_gather(v, AXIS, axis=1, tiled=True)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    q_pos = lax.axis_index(AXIS) * S_LOCAL + jnp.arange(S_LOCAL)
    k_pos = jnp.arange(S)
    s = jnp.where(q_pos[:, None] > k_pos[None, :], s, NEG)
    return _merge(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v), w)


def _seq_sharded(local, w, x, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, AXIS)),
                         out_specs=P(None, AXIS))(w, x)


def attention_gather_kv(w, x, mesh):
    return _seq_sharded(_gather_kv_local, w, x, mesh)


def attention_gather_kv_strict_mask(w, x, mesh):
    return _seq_sharded(_gather_kv_local_strict, w, x, mesh)


# ---- softmax assembled across key shards --------------------------------------------------------

def _partial_scores(w, x):
    q, k, v = _qkv(w, x)
    q = lax.all_gather(q, AXIS, axis=1, tiled=True)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    me = lax.axis_index(AXIS)
    k_pos = me * S_LOCAL + jnp.arange(S_LOCAL)
    s = jnp.where(jnp.arange(S)[:, None] >= k_pos[None, :], s, NEG)
    return s, v, me


def _my_rows(o, me, w):
    return _merge(lax.dynamic_slice_in_dim(o, me * S_LOCAL, S_LOCAL, axis=1), w)


def _sharded_softmax_local(w, x):
    s, v, me = _partial_scores(w, x)
    m = lax.pmax(jnp.max(s, axis=-1, keepdims=True), AXIS)
    p = jnp.exp(s - m)
    num = lax.psum(jnp.einsum("bhqk,bkhd->bqhd", p, v), AXIS)
    den = lax.psum(jnp.sum(p, axis=-1), AXIS)
    return _my_rows(num / jnp.swapaxes(den, 1, 2)[..., None], me, w)


def _sharded_softmax_local_den(w, x):
    s, v, me = _partial_scores(w, x)
    m = lax.pmax(jnp.max(s, axis=-1, keepdims=True), AXIS)
    p = jnp.exp(s - m)
    num = lax.psum(jnp.einsum("bhqk,bkhd->bqhd", p, v), AXIS)
    den = jnp.sum(p, axis=-1)
    return _my_rows(num / jnp.swapaxes(den, 1, 2)[..., None], me, w)


def attention_sharded_softmax(w, x, mesh):
    return _seq_sharded(_sharded_softmax_local, w, x, mesh)


def attention_sharded_softmax_local_denominator(w, x, mesh):
    return _seq_sharded(_sharded_softmax_local_den, w, x, mesh)
