"""Soft MoE layer (Puigcerver et al.): every expert owns SLOTS slots; slot inputs are convex
combinations of the tokens (softmax of x @ phi over tokens), slot outputs are mixed back into the
tokens (softmax of the same logits over all slots). Slots are numbered expert-major
(n = expert * SLOTS + slot); experts are GELU MLPs.

- `soft_moe_ep`: experts, their phi columns and their MLP weights over `expert`, tokens replicated
  within a data group ({data: 2, expert: 4}); the combine softmax over slots spans devices
  (pmax/psum) and the token outputs are psum'd over experts;
- `soft_moe_token_sharded`: tokens split over the same axis as the experts ({expert: 4}); the
  dispatch softmax over tokens spans devices, every device forms partial inputs for all slots and
  `psum_scatter` hands each device its experts' slots; slot outputs are all-gathered back.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, F, E, SLOTS = 2, 16, 16, 32, 8, 2


def moe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"phi": f(D, E * SLOTS), "w1": f(E, D, F), "w2": f(E, F, D)}, f(B, T, D)


def _experts(w1, w2, slots):
    # slots: [B, experts, SLOTS, D]
    hidden = jax.nn.gelu(jnp.einsum("besd,edf->besf", slots, w1))
    return jnp.einsum("besf,efd->besd", hidden, w2)


def soft_moe(p, x):
    logits = jnp.einsum("btd,dn->btn", x, p["phi"])
    dispatch = jax.nn.softmax(logits, axis=1)
    combine = jax.nn.softmax(logits, axis=2)
    slots = jnp.einsum("btn,btd->bnd", dispatch, x).reshape(B, E, SLOTS, D)
    y = _experts(p["w1"], p["w2"], slots).reshape(B, E * SLOTS, D)
    return jnp.einsum("btn,bnd->btd", combine, y)


# ---- experts sharded, tokens replicated -------------------------------------------------------------

def _ep_local(p, x):
    b, n_local = x.shape[0], p["phi"].shape[1]
    logits = jnp.einsum("btd,dn->btn", x, p["phi"])
    dispatch = jax.nn.softmax(logits, axis=1)
    m = lax.pmax(jnp.max(logits, axis=2, keepdims=True), "expert")
    e = jnp.exp(logits - m)
    combine = e / lax.psum(jnp.sum(e, axis=2, keepdims=True), "expert")
    slots = jnp.einsum("btn,btd->bnd", dispatch, x)
    slots = slots.reshape(b, n_local // SLOTS, SLOTS, D)
    y = _experts(p["w1"], p["w2"], slots).reshape(b, n_local, D)
    return lax.psum(jnp.einsum("btn,bnd->btd", combine, y), "expert")


def _ep_local_slot_major(p, x):
    b, n_local = x.shape[0], p["phi"].shape[1]
    logits = jnp.einsum("btd,dn->btn", x, p["phi"])
    dispatch = jax.nn.softmax(logits, axis=1)
    m = lax.pmax(jnp.max(logits, axis=2, keepdims=True), "expert")
    e = jnp.exp(logits - m)
    combine = e / lax.psum(jnp.sum(e, axis=2, keepdims=True), "expert")
    slots = jnp.einsum("btn,btd->bnd", dispatch, x)
    slots = slots.reshape(b, SLOTS, n_local // SLOTS, D).transpose(0, 2, 1, 3)
    y = _experts(p["w1"], p["w2"], slots).reshape(b, n_local, D)
    return lax.psum(jnp.einsum("btn,bnd->btd", combine, y), "expert")


def _ep(local, p, x, mesh):
    specs = {"phi": P(None, "expert"), "w1": P("expert"), "w2": P("expert")}
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, P("data")), out_specs=P("data"),
                         check_vma=False)(p, x)


def soft_moe_ep(p, x, mesh):
    return _ep(_ep_local, p, x, mesh)


def soft_moe_ep_slot_major(p, x, mesh):
    return _ep(_ep_local_slot_major, p, x, mesh)


# ---- tokens and experts over the same axis ----------------------------------------------------------

def _dispatch_global(logits):
    m = lax.pmax(jnp.max(logits, axis=1, keepdims=True), "expert")
    e = jnp.exp(logits - m)
    return e / lax.psum(jnp.sum(e, axis=1, keepdims=True), "expert")


def _dispatch_local_tokens(logits):
    m = lax.pmax(jnp.max(logits, axis=1, keepdims=True), "expert")
    e = jnp.exp(logits - m)
    return e / jnp.sum(e, axis=1, keepdims=True)


def _token_sharded_local(p, x, dispatch_fn):
    b = x.shape[0]
    logits = jnp.einsum("btd,dn->btn", x, p["phi"])
    partial_slots = jnp.einsum("btn,btd->bnd", dispatch_fn(logits), x)
    slots = lax.psum_scatter(partial_slots, "expert", scatter_dimension=1, tiled=True)
    y = _experts(p["w1"], p["w2"], slots.reshape(b, -1, SLOTS, D)).reshape(b, -1, D)
    y_all = lax.all_gather(y, "expert", axis=1, tiled=True)
    return jnp.einsum("btn,bnd->btd", jax.nn.softmax(logits, axis=2), y_all)


def _token_sharded(p, x, mesh, dispatch_fn):
    specs = {"phi": P(), "w1": P("expert"), "w2": P("expert")}
    return jax.shard_map(lambda p_, x_: _token_sharded_local(p_, x_, dispatch_fn), mesh=mesh,
                         in_specs=(specs, P(None, "expert")), out_specs=P(None, "expert"),
                         check_vma=False)(p, x)


def soft_moe_token_sharded(p, x, mesh):
    return _token_sharded(p, x, mesh, _dispatch_global)


def soft_moe_token_sharded_local_dispatch(p, x, mesh):
    return _token_sharded(p, x, mesh, _dispatch_local_tokens)
