"""DeepSeek-V3-style MoE feed-forward: sigmoid router scores, a per-expert selection bias (the
auxiliary-loss-free load-balancing bias) added for the top-k CHOICE only, combine weights = the
unbiased scores of the chosen experts renormalised to sum to one and multiplied by a routed
scaling factor; SwiGLU experts; plus one always-on shared SwiGLU expert.

`moe_ep` on {ep: 4}: 8 routed experts, 2 per device; tokens replicated; every device routes all
tokens, builds the combine weights of its own experts by comparing the chosen ids with its expert
ids (`axis_index * 2 + iota`), runs its experts densely; the shared expert is tensor-parallel over
the same axis (hidden units sharded); one psum adds everything.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

T, D, F, FS, E, K = 16, 16, 16, 32, 8, 2
ROUTED_SCALE = 2.5
EP = 4
E_LOCAL = E // EP


def moe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"router": f(D, E), "router_bias": f(E), "w_gate": f(E, D, F), "w_up": f(E, D, F),
              "w_down": f(E, F, D), "shared_gate": f(D, FS), "shared_up": f(D, FS),
              "shared_down": f(FS, D)}
    return params, f(T, D)


def _swiglu(x, wg, wu, wd):
    return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd


def _route(p, x):
    scores = jax.nn.sigmoid(x @ p["router"])
    _, idx = lax.top_k(scores + p["router_bias"], K)
    chosen = jnp.take_along_axis(scores, idx, axis=-1)
    return idx, chosen / chosen.sum(-1, keepdims=True) * ROUTED_SCALE


def moe(p, x):
    idx, weights = _route(p, x)
    combine = jnp.zeros((T, E)).at[jnp.arange(T)[:, None], idx].add(weights)
    expert_out = jax.vmap(_swiglu, in_axes=(None, 0, 0, 0))(x, p["w_gate"], p["w_up"], p["w_down"])
    routed = jnp.einsum("te,etd->td", combine, expert_out)
    return routed + _swiglu(x, p["shared_gate"], p["shared_up"], p["shared_down"])


SPECS = {"router": P(), "router_bias": P(), "w_gate": P("ep"), "w_up": P("ep"), "w_down": P("ep"),
         "shared_gate": P(None, "ep"), "shared_up": P(None, "ep"), "shared_down": P("ep", None)}


def _local_moe(p, x, route):
    idx, weights = route(p, x)
    mine = lax.axis_index("ep") * E_LOCAL + jnp.arange(E_LOCAL)
    combine = jnp.sum(jnp.where(idx[:, :, None] == mine, weights[:, :, None], 0.0), axis=1)
    expert_out = jax.vmap(_swiglu, in_axes=(None, 0, 0, 0))(x, p["w_gate"], p["w_up"], p["w_down"])
    routed = jnp.einsum("te,etd->td", combine, expert_out)
    shared = _swiglu(x, p["shared_gate"], p["shared_up"], p["shared_down"])
    return lax.psum(routed + shared, "ep")


def _route_biased_weights(p, x):
    biased = jax.nn.sigmoid(x @ p["router"]) + p["router_bias"]
    _, idx = lax.top_k(biased, K)
    chosen = jnp.take_along_axis(biased, idx, axis=-1)
    return idx, chosen / chosen.sum(-1, keepdims=True) * ROUTED_SCALE


def moe_ep(p, x, mesh):
    local = lambda p, x: _local_moe(p, x, _route)
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P()), out_specs=P(), check_vma=False)(p, x)


def moe_ep_biased_weights(p, x, mesh):
    local = lambda p, x: _local_moe(p, x, _route_biased_weights)
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P()), out_specs=P(), check_vma=False)(p, x)
