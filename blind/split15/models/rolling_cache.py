"""Mistral-style rolling-buffer KV cache, one decode step: the new token's key / value are written at
slot `pos % W` of a W-slot ring buffer, and the query attends to every slot holding a real token of
the last W positions (slot i holds absolute position `pos - (pos - i) % W`, real when >= 0).
Per-example positions `pos` [B] (int, in [0, 24) so the ring wraps); heads over `tp` and batch over
`dp` on {dp: 2, tp: 2}. Returns (output, new K cache, new V cache).

- `decode_tp_scatter`: cache update with `.at[rows, slot].set`, validity from absolute positions;
- `decode_tp_vmapped`: per-example step under `jax.vmap`, cache written with
  `lax.dynamic_update_slice_in_dim`, validity from the slot's age `(pos - i) % W <= pos`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, H, HD, W = 4, 32, 4, 8, 8


def decode_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}
    cache = f(B, W, H, HD)
    return params, f(B, D), jax.ShapeDtypeStruct((B,), jnp.int32), cache, cache


def _project(p, x):
    return (jnp.einsum("bd,dhk->bhk", x, p[n]) for n in ("wq", "wk", "wv"))


def _attend(p, q, k_cache, v_cache, valid):
    s = jnp.einsum("bhk,bwhk->bhw", q, k_cache) * HD ** -0.5
    s = jnp.where(valid[:, None, :], s, -1e30)
    o = jnp.einsum("bhw,bwhk->bhk", jax.nn.softmax(s, axis=-1), v_cache)
    return jnp.einsum("bhk,hkd->bd", o, p["wo"])


def decode_step(p, x, pos, k_cache, v_cache):
    q, k, v = _project(p, x)
    rows, slot = jnp.arange(B), pos % W
    k_cache = k_cache.at[rows, slot].set(k)
    v_cache = v_cache.at[rows, slot].set(v)
    absolute = pos[:, None] - (pos[:, None] - jnp.arange(W)[None, :]) % W
    return _attend(p, q, k_cache, v_cache, absolute >= 0), k_cache, v_cache


P_SPECS = {"wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp")}
CACHE = P("dp", None, "tp")


def _sharded(local, p, x, pos, k_cache, v_cache, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P_SPECS, P("dp"), P("dp"), CACHE, CACHE),
                         out_specs=(P("dp"), CACHE, CACHE), check_vma=False)(p, x, pos, k_cache, v_cache)


# ---- scatter update, absolute positions ----------------------------------------------------------

def _scatter_local(p, x, pos, k_cache, v_cache):
    q, k, v = _project(p, x)
    rows, slot = jnp.arange(x.shape[0]), pos % W
    k_cache = k_cache.at[rows, slot].set(k)
    v_cache = v_cache.at[rows, slot].set(v)
    absolute = pos[:, None] - (pos[:, None] - jnp.arange(W)[None, :]) % W
    y = _attend(p, q, k_cache, v_cache, absolute >= 0)
    return lax.psum(y, "tp"), k_cache, v_cache


def _scatter_local_strict(p, x, pos, k_cache, v_cache):
    q, k, v = _project(p, x)
    rows, slot = jnp.arange(x.shape[0]), pos % W
    k_cache = k_cache.at[rows, slot].set(k)
    v_cache = v_cache.at[rows, slot].set(v)
    absolute = pos[:, None] - (pos[:, None] - jnp.arange(W)[None, :]) % W
    y = _attend(p, q, k_cache, v_cache, absolute > 0)
    return lax.psum(y, "tp"), k_cache, v_cache


def decode_tp_scatter(p, x, pos, k_cache, v_cache, mesh):
    return _sharded(_scatter_local, p, x, pos, k_cache, v_cache, mesh)


def decode_tp_scatter_strict_mask(p, x, pos, k_cache, v_cache, mesh):
    return _sharded(_scatter_local_strict, p, x, pos, k_cache, v_cache, mesh)


# ---- vmapped per-example step ---------------------------------------------------------------------

def _one_example(p, x, pos, k_cache, v_cache, slot_of):
    q, k, v = _project(p, x[None])
    slot = slot_of(pos)
    k_cache = lax.dynamic_update_slice_in_dim(k_cache, k, slot, axis=0)
    v_cache = lax.dynamic_update_slice_in_dim(v_cache, v, slot, axis=0)
    age = (pos - jnp.arange(W)) % W
    y = _attend(p, q, k_cache[None], v_cache[None], (age <= pos)[None])
    return y[0], k_cache, v_cache


def _ring_slot(pos):
    return pos % W


def _ring_slot_after(pos):
    return (pos + 1) % W


def _vmapped(slot_of, p, x, pos, k_cache, v_cache, mesh):
    def local(p, x, pos, k_cache, v_cache):
        step = jax.vmap(lambda x, pos, kc, vc: _one_example(p, x, pos, kc, vc, slot_of))
        y, k_cache, v_cache = step(x, pos, k_cache, v_cache)
        return lax.psum(y, "tp"), k_cache, v_cache
    return _sharded(local, p, x, pos, k_cache, v_cache, mesh)


def decode_tp_vmapped(p, x, pos, k_cache, v_cache, mesh):
    return _vmapped(_ring_slot, p, x, pos, k_cache, v_cache, mesh)


def decode_tp_vmapped_slot_after(p, x, pos, k_cache, v_cache, mesh):
    return _vmapped(_ring_slot_after, p, x, pos, k_cache, v_cache, mesh)
