"""OLMoE/Qwen-MoE-style layer: softmax router, top-2 experts whose probabilities are renormalised
to sum to one, SwiGLU experts, and the Switch load-balancing loss E * sum_e f_e * P_e where f_e
counts (with bincount) how often e is a token's first choice. Returns (y, aux).

- `moe_experts_sharded`: shard_map on {ep: 4}, tokens replicated, two experts per device applied
  densely with their combine weights, outputs psum'd;
- `moe_sorted_all_to_all`: on {ep: 4}, tokens sharded too: each rank argsorts its (token, expert)
  assignments by expert, gives each a slot inside its expert (rank in the sorted order minus the
  expert's bincount start), scatters tokens into an [expert, slot] buffer that `all_to_all` sends
  to the experts' ranks and back; counts and mean probabilities psum'd for the aux loss.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

S, D, F, E, K = 32, 16, 24, 8, 2


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"router": f(D, E), "w_gate": f(E, D, F), "w_up": f(E, D, F), "w_down": f(E, F, D)}, f(S, D)


def _route(router, x):
    probs = jax.nn.softmax(x @ router, -1)
    top_p, top_i = lax.top_k(probs, K)
    return probs, top_p / jnp.sum(top_p, -1, keepdims=True), top_i


def _experts(p, x, combine):
    """combine [S, E_local]; experts applied densely to every token."""
    h = jax.nn.silu(jnp.einsum("sd,edf->esf", x, p["w_gate"])) * jnp.einsum("sd,edf->esf", x, p["w_up"])
    return jnp.einsum("esf,efd,se->sd", h, p["w_down"], combine)


def _aux(probs, top_i, counts_sum=lambda c: c, mean_sum=lambda m: m, n_tokens=S):
    counts = counts_sum(jnp.bincount(top_i[:, 0], length=E).astype(jnp.float32))
    mean_p = mean_sum(jnp.sum(probs, 0))
    return E * jnp.sum(counts / n_tokens * mean_p / n_tokens)


def moe(p, x):
    probs, w, top_i = _route(p["router"], x)
    combine = jnp.sum(jax.nn.one_hot(top_i, E) * w[..., None], axis=1)
    return _experts(p, x, combine), _aux(probs, top_i)


SPECS = {"router": P(), "w_gate": P("ep"), "w_up": P("ep"), "w_down": P("ep")}


# ---- experts over ep, tokens replicated ----------------------------------------------------------

def _renormalised(top_p, probs):
    return top_p / jnp.sum(top_p, -1, keepdims=True)


def _renormalised_over_all(top_p, probs):
    return top_p / jnp.sum(probs, -1, keepdims=True)


def _experts_local(p, x, renorm):
    probs = jax.nn.softmax(x @ p["router"], -1)
    top_p, top_i = lax.top_k(probs, K)
    w = renorm(top_p, probs)
    el = p["w_gate"].shape[0]
    ids = lax.axis_index("ep") * el + jnp.arange(el)
    combine = jnp.sum((top_i[..., None] == ids) * w[..., None], axis=1)
    return lax.psum(_experts(p, x, combine), "ep"), _aux(probs, top_i)


def _run_experts(p, x, mesh, renorm):
    local = lambda p, x: _experts_local(p, x, renorm)
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P()), out_specs=(P(), P()),
                         check_vma=False)(p, x)


def moe_experts_sharded(p, x, mesh):
    return _run_experts(p, x, mesh, _renormalised)


def moe_experts_sharded_renorm_over_all(p, x, mesh):
    return _run_experts(p, x, mesh, _renormalised_over_all)


# ---- tokens over ep: argsort dispatch into per-expert slots, all_to_all both ways ---------------

def _slots_unsorted(slot_sorted, order):
    return jnp.zeros_like(slot_sorted).at[order].set(slot_sorted)


def _slots_permuted_forward(slot_sorted, order):
    return slot_sorted[order]


def _a2a_local(p, x, unsort):
    n = lax.axis_size("ep")
    s_loc = x.shape[0]
    probs, w, top_i = _route(p["router"], x)
    aux = _aux(probs, top_i, lambda c: lax.psum(c, "ep"), lambda m: lax.psum(m, "ep"))
    e_flat = top_i.reshape(-1)                      # assignment a = token * K + k
    order = jnp.argsort(e_flat, stable=True)
    sizes = jnp.bincount(e_flat, length=E)
    starts = jnp.cumsum(sizes) - sizes
    slot_sorted = jnp.arange(e_flat.shape[0]) - starts[e_flat[order]]
    slot = unsort(slot_sorted, order)
    cap = s_loc                                     # a token picks an expert at most once: no drops
    tok = jnp.arange(e_flat.shape[0]) // K
    buf = jnp.zeros((E, cap, D), x.dtype).at[e_flat, slot].set(x[tok])
    recv = lax.all_to_all(buf.reshape(n, E // n, cap, D), "ep", 0, 0, tiled=False)
    h = jnp.moveaxis(recv, 1, 0).reshape(E // n, n * cap, D)
    h = jax.nn.silu(jnp.einsum("esd,edf->esf", h, p["w_gate"])) * jnp.einsum("esd,edf->esf", h, p["w_up"])
    h = jnp.einsum("esf,efd->esd", h, p["w_down"])
    back = lax.all_to_all(jnp.moveaxis(h.reshape(E // n, n, cap, D), 1, 0), "ep", 0, 0, tiled=False)
    out = back.reshape(E, cap, D)[e_flat, slot] * w.reshape(-1)[:, None]
    return out.reshape(s_loc, K, D).sum(1), aux


def _run_a2a(p, x, mesh, unsort):
    local = lambda p, x: _a2a_local(p, x, unsort)
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P("ep")), out_specs=(P("ep"), P()),
                         check_vma=False)(p, x)


def moe_sorted_all_to_all(p, x, mesh):
    return _run_a2a(p, x, mesh, _slots_unsorted)


def moe_sorted_all_to_all_slots_not_inverted(p, x, mesh):
    return _run_a2a(p, x, mesh, _slots_permuted_forward)
