"""Causal linear attention (elu(x) + 1 feature map, as in "Transformers are RNNs") with its
normaliser, sequence parallel: each chunk needs the sum of k^T v (and of k) over all earlier chunks.

- `linear_attn_gathered_prefix`: on {sp: 4}, every chunk's state is all-gathered and the states of
  the chunks before this one (by `axis_index`) are summed;
- `linear_attn_doubling_prefix`: on {dp: 2, sp: 4}, an exclusive prefix over devices by log-step
  doubling with non-cyclic `ppermute` (shift 1, then 2).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, HD = 2, 16, 16, 8


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, HD), "wk": f(D, HD), "wv": f(D, HD), "wo": f(HD, D)}, f(B, T, D)


def phi(x):
    return jax.nn.elu(x) + 1.0


def _features(p, x):
    return phi(x @ p["wq"]), phi(x @ p["wk"]), x @ p["wv"]


def _read(p, q, kv, ksum):
    num = jnp.einsum("btf,btfe->bte", q, kv)
    den = jnp.einsum("btf,btf->bt", q, ksum)[..., None]
    return (num / den) @ p["wo"]


def linear_attention(p, x):
    q, k, v = _features(p, x)
    kv = jnp.cumsum(jnp.einsum("btf,bte->btfe", k, v), axis=1)
    ksum = jnp.cumsum(k, axis=1)
    return x + _read(p, q, kv, ksum)


def _local_chunk(p, x, prefix):
    q, k, v = _features(p, x)
    kv_local = jnp.einsum("btf,bte->btfe", k, v)
    state = (kv_local.sum(1), k.sum(1))
    kv_before, k_before = prefix(state)
    kv = jnp.cumsum(kv_local, axis=1) + kv_before[:, None]
    ksum = jnp.cumsum(k, axis=1) + k_before[:, None]
    return x + _read(p, q, kv, ksum)


# ---- all-gathered states -------------------------------------------------------------------------

def _gathered_prefix(state):
    me = lax.axis_index("sp")
    def before(s):
        every = lax.all_gather(s, "sp")
        keep = jnp.arange(every.shape[0]) < me
        return jnp.tensordot(keep.astype(s.dtype), every, axes=1)
    return jax.tree_util.tree_map(before, state)


def _gathered_prefix_inclusive(state):
    me = lax.axis_index("sp")
    def before(s):
        every = lax.all_gather(s, "sp")
        keep = jnp.arange(every.shape[0]) <= me
        return jnp.tensordot(keep.astype(s.dtype), every, axes=1)
    return jax.tree_util.tree_map(before, state)


def _sp(p, x, mesh, prefix, spec):
    local = lambda p, x: _local_chunk(p, x, prefix)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), spec), out_specs=spec,
                         check_vma=False)(p, x)


def linear_attn_gathered_prefix(p, x, mesh):
    return _sp(p, x, mesh, _gathered_prefix, P(None, "sp"))


def linear_attn_gathered_prefix_inclusive(p, x, mesh):
    return _sp(p, x, mesh, _gathered_prefix_inclusive, P(None, "sp"))


# ---- log-step doubling with ppermute -------------------------------------------------------------

def _doubling_prefix(state, cyclic=False):
    n = lax.axis_size("sp")
    # exclusive: start from the previous device's own state
    total = jax.tree_util.tree_map(lambda s: lax.ppermute(s, "sp", [(i, i + 1) for i in range(n - 1)]), state)
    shift = 1
    while shift < n:
        if cyclic:
            pairs = [(i, (i + shift) % n) for i in range(n)]
        else:
            pairs = [(i, i + shift) for i in range(n - shift)]
        total = jax.tree_util.tree_map(lambda t: t + lax.ppermute(t, "sp", pairs), total)
        shift *= 2
    return total


def _doubling_prefix_cyclic(state):
    return _doubling_prefix(state, cyclic=True)


def linear_attn_doubling_prefix(p, x, mesh):
    return _sp(p, x, mesh, _doubling_prefix, P("dp", "sp"))


def linear_attn_doubling_prefix_cyclic(p, x, mesh):
    return _sp(p, x, mesh, _doubling_prefix_cyclic, P("dp", "sp"))
