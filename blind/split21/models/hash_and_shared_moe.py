"""Two mixture-of-experts layers with experts sharded over an expert-parallel axis:

- hash routing (Hash Layers): a token's expert is a fixed hash of its token id, no router, with a
  GShard-style capacity of 3 slots per expert in each group of 8 tokens (later tokens dropped, the
  residual passes). `hash_moe_a2a` on {dp: 2, ep: 2}: one group per device (tokens over dp x ep),
  two experts per ep rank; tokens are sorted by expert (argsort + bincount offsets give the slot),
  scattered into an [E, CAP, D] buffer, exchanged with all_to_all, and combined back;
- Qwen2-MoE style: softmax router, top-2 of 4 routed experts (weights not renormalised) plus an
  always-on shared expert gated by a sigmoid; `qwen_moe_ep` on {ep: 4}, tokens replicated, each
  rank runs its expert on the dense batch weighted by its combine column, psum over ep.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, F, E, K = 4, 8, 16, 32, 4, 2
GROUPS, CAP = 4, 3


def hash_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(E, D, F), f(E, F, D), f(B, T, D), jax.ShapeDtypeStruct((B, T), jnp.int32)


def qwen_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, E), f(E, D, F), f(E, F, D), f(D, F), f(F, D), f(D), f(B, T, D)


def _expert(x, w1, w2):
    return jax.nn.silu(x @ w1) @ w2


def _hash(ids):
    return (ids * 31 + 7) % E


def _group_slots(e):
    """Position of every token among the earlier tokens of its group routed to the same expert."""
    onehot = jax.nn.one_hot(e, E, dtype=jnp.int32)
    return jnp.sum((jnp.cumsum(onehot, 0) - 1) * onehot, -1)


def hash_moe(w1, w2, x, ids):
    xg, eg = x.reshape(GROUPS, -1, D), _hash(ids).reshape(GROUPS, -1)
    every = jax.vmap(lambda a, b: _expert(xg, a, b))(w1, w2)                  # [E, G, S, D]
    keep = (jax.vmap(_group_slots)(eg) < CAP).astype(x.dtype)
    onehot = jax.nn.one_hot(eg, E, dtype=x.dtype) * keep[..., None]
    return x + jnp.einsum("egsd,gse->gsd", every, onehot).reshape(x.shape)


def _fits(slot):
    return slot < CAP


def _fits_inclusive(slot):
    return slot <= CAP


def _a2a_local(w1, w2, x, ids, fits):
    el = w1.shape[0]
    xs, e = x.reshape(-1, D), _hash(ids).reshape(-1)
    order = jnp.argsort(e, stable=True)
    e_sorted = e[order]
    counts = jnp.bincount(e, length=E)
    slot = jnp.arange(e.shape[0]) - (jnp.cumsum(counts) - counts)[e_sorted]
    keep = fits(slot)
    buf = jnp.zeros((E, CAP, D), x.dtype).at[e_sorted, slot].set(xs[order], mode="drop")
    recv = lax.all_to_all(buf, "ep", 0, 0, tiled=True).reshape(-1, el, CAP, D)
    out = jnp.stack([_expert(recv[:, j], w1[j], w2[j]) for j in range(el)], 1).reshape(E, CAP, D)
    back = lax.all_to_all(out, "ep", 0, 0, tiled=True)
    y_sorted = jnp.where(keep[:, None], back[e_sorted, jnp.minimum(slot, CAP - 1)], 0.0)
    return x + jnp.zeros_like(xs).at[order].set(y_sorted).reshape(x.shape)


def _run_hash(w1, w2, x, ids, mesh, fits):
    local = lambda *a: _a2a_local(*a, fits)
    tokens = P(("dp", "ep"))
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P("ep"), P("ep"), tokens, tokens),
                         out_specs=tokens)(w1, w2, x, ids)


def hash_moe_a2a(w1, w2, x, ids, mesh):
    return _run_hash(w1, w2, x, ids, mesh, _fits)


def hash_moe_a2a_capacity_inclusive(w1, w2, x, ids, mesh):
    return _run_hash(w1, w2, x, ids, mesh, _fits_inclusive)


def _route(router, x):
    probs = jax.nn.softmax(x @ router, -1)
    top_p, top_i = lax.top_k(probs, K)
    return jnp.sum(jax.nn.one_hot(top_i, E, dtype=x.dtype) * top_p[..., None], -2)   # [B, T, E]


def qwen_moe(router, w1, w2, ws1, ws2, w_gate, x):
    combine = _route(router, x)
    every = jax.vmap(lambda a, b: _expert(x, a, b))(w1, w2)
    routed = jnp.einsum("ebtd,bte->btd", every, combine)
    shared = jax.nn.sigmoid(x @ w_gate)[..., None] * _expert(x, ws1, ws2)
    return routed + shared


def _qwen_local(router, w1, w2, ws1, ws2, w_gate, x):
    combine = _route(router, x)
    e = lax.axis_index("ep")
    routed = combine[..., e][..., None] * _expert(x, w1[0], w2[0])
    shared = jax.nn.sigmoid(x @ w_gate)[..., None] * _expert(x, ws1, ws2)
    return lax.psum(routed, "ep") + shared


def _qwen_local_shared_in_psum(router, w1, w2, ws1, ws2, w_gate, x):
    combine = _route(router, x)
    e = lax.axis_index("ep")
    routed = combine[..., e][..., None] * _expert(x, w1[0], w2[0])
    shared = jax.nn.sigmoid(x @ w_gate)[..., None] * _expert(x, ws1, ws2)
    return lax.psum(routed + shared, "ep")


def _run_qwen(args, mesh, local):
    specs = (P(), P("ep"), P("ep"), P(), P(), P(), P())
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=specs, out_specs=P())(*args)


def qwen_moe_ep(router, w1, w2, ws1, ws2, w_gate, x, mesh):
    return _run_qwen((router, w1, w2, ws1, ws2, w_gate, x), mesh, _qwen_local)


def qwen_moe_ep_shared_in_psum(router, w1, w2, ws1, ws2, w_gate, x, mesh):
    return _run_qwen((router, w1, w2, ws1, ws2, w_gate, x), mesh, _qwen_local_shared_in_psum)
