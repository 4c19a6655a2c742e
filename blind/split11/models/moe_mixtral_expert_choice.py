"""Sparse mixture-of-experts layers with experts sharded over the mesh (tokens broadcast).

1. Mixtral-style top-2 token choice: softmax over the two selected router logits, SwiGLU experts;
   the reference gathers every expert's output with jnp.take_along_axis. Expert parallel over
   {expert: 4}: every rank routes all tokens, keeps the gate weights of the experts it owns and
   psums its weighted outputs.
2. Expert-choice routing (each expert picks its top-C tokens by router probability) with GELU
   experts, scatter-add combine. Expert parallel over {ep: 2} with the router columns sharded with
   the experts, so the router softmax is normalized across ranks.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, E, K = 16, 16, 32, 8, 2


def mixtral_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"router": f(D, E), "w1": f(E, D, F), "w3": f(E, D, F), "w2": f(E, F, D)}, f(N, D)


def _swiglu_experts(p, x):
    # every expert on every token: [E, N, D]
    a = jnp.einsum("nd,edf->enf", x, p["w1"])
    b = jnp.einsum("nd,edf->enf", x, p["w3"])
    return jnp.einsum("enf,efd->end", jax.nn.silu(a) * b, p["w2"])


def mixtral_moe(params, x):
    top_logits, top_idx = lax.top_k(x @ params["router"], K)
    gates = jax.nn.softmax(top_logits, axis=-1)                      # [N, K]
    ys = jnp.swapaxes(_swiglu_experts(params, x), 0, 1)              # [N, E, D]
    picked = jnp.take_along_axis(ys, top_idx[..., None], axis=1)     # [N, K, D]
    return jnp.einsum("nk,nkd->nd", gates, picked)


def _mixtral_ep(params, x):
    e_local = params["w1"].shape[0]
    top_logits, top_idx = lax.top_k(x @ params["router"], K)
    gates = jax.nn.softmax(top_logits, axis=-1)
    owned = lax.axis_index("expert") * e_local + jnp.arange(e_local)
    local_gates = jnp.sum(jnp.where(top_idx[:, :, None] == owned, gates[:, :, None], 0.0), axis=1)
    ys = _swiglu_experts(params, x)
    return lax.psum(jnp.einsum("ne,end->nd", local_gates, ys), "expert")


def _mixtral_ep_expert_offset(params, x):
    e_local = params["w1"].shape[0]
    top_logits, top_idx = lax.top_k(x @ params["router"], K)
    gates = jax.nn.softmax(top_logits, axis=-1)
    owned = lax.axis_index("expert") + jnp.arange(e_local)
    local_gates = jnp.sum(jnp.where(top_idx[:, :, None] == owned, gates[:, :, None], 0.0), axis=1)
    ys = _swiglu_experts(params, x)
    return lax.psum(jnp.einsum("ne,end->nd", local_gates, ys), "expert")


_MIXTRAL_SPECS = {"router": P(), "w1": P("expert"), "w3": P("expert"), "w2": P("expert")}


def mixtral_moe_ep(params, x, mesh):
    return jax.shard_map(_mixtral_ep, mesh=mesh, in_specs=(_MIXTRAL_SPECS, P()),
                         out_specs=P())(params, x)


def mixtral_moe_ep_expert_offset(params, x, mesh):
    return jax.shard_map(_mixtral_ep_expert_offset, mesh=mesh, in_specs=(_MIXTRAL_SPECS, P()),
                         out_specs=P())(params, x)


# ---- expert-choice routing ----------------------------------------------------------------------

C = 4


def expert_choice_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"router": f(D, E), "w_in": f(E, D, F), "w_out": f(E, F, D)}, f(N, D)


def _choose_and_apply(probs_t, w_in, w_out, x):
    """probs_t: [experts, N] router probabilities -> combined [N, D] for these experts."""
    g, idx = lax.top_k(probs_t, C)                                   # [e, C]
    xin = x[idx]                                                     # [e, C, D]
    y = jnp.einsum("ecf,efd->ecd", jax.nn.gelu(jnp.einsum("ecd,edf->ecf", xin, w_in)), w_out)
    return jnp.zeros_like(x).at[idx.reshape(-1)].add((g[..., None] * y).reshape(-1, x.shape[1]))


def expert_choice_moe(params, x):
    probs = jax.nn.softmax(x @ params["router"], axis=-1)           # [N, E]
    return _choose_and_apply(probs.T, params["w_in"], params["w_out"], x)


def _expert_choice_ep(params, x):
    logits = x @ params["router"]                                    # [N, E_local]
    m = lax.pmax(lax.stop_gradient(logits.max(axis=-1, keepdims=True)), "ep")
    z = jnp.exp(logits - m)
    probs = z / lax.psum(jnp.sum(z, axis=-1, keepdims=True), "ep")
    return lax.psum(_choose_and_apply(probs.T, params["w_in"], params["w_out"], x), "ep")


def _expert_choice_ep_local_norm(params, x):
    logits = x @ params["router"]                                    # [N, E_local]
    m = lax.pmax(lax.stop_gradient(logits.max(axis=-1, keepdims=True)), "ep")
    z = jnp.exp(logits - m)
    probs = z / jnp.sum(z, axis=-1, keepdims=True)
    return lax.psum(_choose_and_apply(probs.T, params["w_in"], params["w_out"], x), "ep")


_EC_SPECS = {"router": P(None, "ep"), "w_in": P("ep"), "w_out": P("ep")}


def expert_choice_moe_ep(params, x, mesh):
    return jax.shard_map(_expert_choice_ep, mesh=mesh, in_specs=(_EC_SPECS, P()),
                         out_specs=P())(params, x)


def expert_choice_moe_ep_local_norm(params, x, mesh):
    return jax.shard_map(_expert_choice_ep_local_norm, mesh=mesh, in_specs=(_EC_SPECS, P()),
                         out_specs=P())(params, x)
