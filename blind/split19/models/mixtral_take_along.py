"""Mixtral/Qwen-MoE style top-2 router with renormalised gate weights (`norm_topk_prob`): every
expert is a SwiGLU evaluated densely on all tokens, and the two chosen experts' outputs are picked
with `jnp.take_along_axis` on the [tokens, experts, d] stack and weighted.

- `moe_ep`: on {ep: 4}, two experts per device; routing is computed on every device, the device
  turns the top-2 choice into a dense [tokens, experts] combine matrix and keeps its own columns
  (`dynamic_slice_in_dim` at axis_index * experts_per_device), then psum;
- `moe_dp_ep`: on {data: 2, ep: 2}, tokens over data, experts over ep, the top-2 found with
  `argsort` instead of `top_k`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, E, K = 16, 16, 32, 8, 2


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, E), f(E, D, F), f(E, D, F), f(E, F, D), f(N, D)


def _experts(w1, w3, w2, x):
    h = jax.nn.silu(jnp.einsum("nd,edf->nef", x, w1)) * jnp.einsum("nd,edf->nef", x, w3)
    return jnp.einsum("nef,efd->ned", h, w2)


def moe(wg, w1, w3, w2, x):
    probs = jax.nn.softmax(x @ wg, axis=-1)
    top_p, top_i = lax.top_k(probs, K)
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    outs = _experts(w1, w3, w2, x)
    chosen = jnp.take_along_axis(outs, top_i[:, :, None], axis=1)
    return jnp.sum(top_p[:, :, None] * chosen, axis=1)


def _combine(top_p, top_i):
    return jnp.sum(jax.nn.one_hot(top_i, E) * top_p[:, :, None], axis=1)


# ---- experts over ep, routing replicated --------------------------------------------------------

def _first_expert(e_local):
    return lax.axis_index("ep") * e_local


def _first_expert_unscaled(e_local):
    return lax.axis_index("ep")


def _ep_local(wg, w1, w3, w2, x, first):
    probs = jax.nn.softmax(x @ wg, axis=-1)
    top_p, top_i = lax.top_k(probs, K)
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    e_local = w1.shape[0]
    mine = lax.dynamic_slice_in_dim(_combine(top_p, top_i), first(e_local), e_local, axis=1)
    outs = _experts(w1, w3, w2, x)
    return lax.psum(jnp.einsum("ne,ned->nd", mine, outs), "ep")


def _ep(args, mesh, first):
    e = P("ep", None, None)
    return jax.shard_map(lambda *a: _ep_local(*a, first), mesh=mesh,
                         in_specs=(P(), e, e, e, P()), out_specs=P(), check_vma=False)(*args)


def moe_ep(wg, w1, w3, w2, x, mesh):
    return _ep((wg, w1, w3, w2, x), mesh, _first_expert)


def moe_ep_unscaled_offset(wg, w1, w3, w2, x, mesh):
    return _ep((wg, w1, w3, w2, x), mesh, _first_expert_unscaled)


# ---- tokens over data, experts over ep, argsort routing -----------------------------------------

def _renormalised(top_p):
    return top_p / jnp.sum(top_p, axis=-1, keepdims=True)


def _not_renormalised(top_p):
    return top_p


def _dp_ep_local(wg, w1, w3, w2, x, norm):
    probs = jax.nn.softmax(x @ wg, axis=-1)
    top_i = jnp.argsort(-probs, axis=-1)[:, :K]
    top_p = norm(jnp.take_along_axis(probs, top_i, axis=-1))
    e_local = w1.shape[0]
    first = lax.axis_index("ep") * e_local
    local_ids = top_i - first
    hit = (local_ids >= 0) & (local_ids < e_local)
    outs = _experts(w1, w3, w2, x)
    chosen = jnp.take_along_axis(outs, jnp.clip(local_ids, 0, e_local - 1)[:, :, None], axis=1)
    y = jnp.sum(jnp.where(hit, top_p, 0.0)[:, :, None] * chosen, axis=1)
    return lax.psum(y, "ep")


def _dp_ep(args, mesh, norm):
    e = P("ep", None, None)
    return jax.shard_map(lambda *a: _dp_ep_local(*a, norm), mesh=mesh,
                         in_specs=(P(), e, e, e, P("data", None)), out_specs=P("data", None),
                         check_vma=False)(*args)


def moe_dp_ep(wg, w1, w3, w2, x, mesh):
    return _dp_ep((wg, w1, w3, w2, x), mesh, _renormalised)


def moe_dp_ep_unnormalised(wg, w1, w3, w2, x, mesh):
    return _dp_ep((wg, w1, w3, w2, x), mesh, _not_renormalised)
