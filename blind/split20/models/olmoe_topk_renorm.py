"""OLMoE/Qwen-MoE-style layer: softmax router, top-2 experts whose probabilities are renormalised
to sum to one, SwiGLU experts, and the Switch load-balancing loss E * sum_e f_e * P_e where f_e
counts (with bincount) how often e is a token's first choice. Returns (y, aux).

- `moe_experts_sharded`: shard_map on {ep: 4}, tokens replicated, two experts per device applied
  densely with their combine weights, outputs psum'd;
- `moe_tokens_and_experts`: on {ep: 4}, tokens sharded too: tokens all-gathered, local experts
  applied, the sum reduce-scattered back to the token shards (psum_scatter); counts and mean
  probabilities psum'd for the aux loss.
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


# ---- tokens and experts over ep ------------------------------------------------------------------

def _first_expert(el):
    return lax.axis_index("ep") * el


def _first_expert_unshifted(el):
    return 0


def _tokens_local(p, x_shard, first_expert):
    probs, w, top_i = _route(p["router"], x_shard)
    aux = _aux(probs, top_i, lambda c: lax.psum(c, "ep"), lambda m: lax.psum(m, "ep"))
    x = lax.all_gather(x_shard, "ep", tiled=True)
    w_all = lax.all_gather(w, "ep", tiled=True)
    i_all = lax.all_gather(top_i, "ep", tiled=True)
    el = p["w_gate"].shape[0]
    ids = first_expert(el) + jnp.arange(el)
    combine = jnp.sum((i_all[..., None] == ids) * w_all[..., None], axis=1)
    y = lax.psum_scatter(_experts(p, x, combine), "ep", scatter_dimension=0, tiled=True)
    return y, aux


def _run_tokens(p, x, mesh, first_expert):
    local = lambda p, x: _tokens_local(p, x, first_expert)
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P("ep")), out_specs=(P("ep"), P()),
                         check_vma=False)(p, x)


def moe_tokens_and_experts(p, x, mesh):
    return _run_tokens(p, x, mesh, _first_expert)


def moe_tokens_and_experts_expert_ids_unshifted(p, x, mesh):
    return _run_tokens(p, x, mesh, _first_expert_unshifted)
