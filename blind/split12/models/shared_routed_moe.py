"""Qwen2-MoE / DeepSeek-MoE style feed-forward: top-2 routed SwiGLU experts (softmax router, top-k
weights renormalised to sum to 1) plus an always-on shared expert gated by sigmoid(x @ w_gate).

Expert parallel over {ep: 4} (8 experts, 2 per shard); tokens are replicated on every shard, the
shared expert is tensor-parallel over the same axis (hidden units sharded), and one psum combines
both. Two dispatch implementations:
- `moe_ep_dense`: an argsort-based top-k, combine weights for the shard's experts from one_hot of
  (expert id - first local expert), every local expert on every token (einsum over experts);
- `moe_ep_sorted`: per local expert, the tokens are sorted so the routed ones come first
  (stable argsort of the "not routed" flag), the expert runs on the sorted rows (vmapped over local
  experts), gated, and the rows are scattered back to token order.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, F, FS, E, K = 2, 8, 16, 32, 64, 8, 2
T = B * S


def moe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {
        "router": f(D, E),
        "experts": {"gate": f(E, D, F), "up": f(E, D, F), "down": f(E, F, D)},
        "shared": {"gate": f(D, FS), "up": f(D, FS), "down": f(FS, D)},
        "shared_gate": f(D, 1),
    }
    return params, f(B, S, D)


def _swiglu(w, x):
    return (jax.nn.silu(x @ w["gate"]) * (x @ w["up"])) @ w["down"]


def moe_ffn(params, x):
    tokens = x.reshape(T, D)
    probs = jax.nn.softmax(tokens @ params["router"], axis=-1)
    top_w, top_i = lax.top_k(probs, K)
    top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
    combine = jnp.zeros((T, E)).at[jnp.arange(T)[:, None], top_i].add(top_w)
    every = jax.vmap(_swiglu, in_axes=(0, None))(params["experts"], tokens)     # [E, T, D]
    routed = jnp.einsum("te,etd->td", combine, every)
    shared = jax.nn.sigmoid(tokens @ params["shared_gate"]) * _swiglu(params["shared"], tokens)
    return (routed + shared).reshape(B, S, D)


_SPECS = {
    "router": P(),
    "experts": {"gate": P("ep"), "up": P("ep"), "down": P("ep")},
    "shared": {"gate": P(None, "ep"), "up": P(None, "ep"), "down": P("ep", None)},
    "shared_gate": P(),
}


def _top_k(router, tokens):
    probs = jax.nn.softmax(tokens @ router, axis=-1)
    top_i = jnp.argsort(-probs, axis=-1)[:, :K]
    return jnp.take_along_axis(probs, top_i, axis=-1), top_i


def _route(router, tokens):
    top_w, top_i = _top_k(router, tokens)
    return top_w / jnp.sum(top_w, axis=-1, keepdims=True), top_i


def _route_raw(router, tokens):
    top_w, top_i = _top_k(router, tokens)
    return top_w, top_i


def _shared_partial(params, tokens):
    return jax.nn.sigmoid(tokens @ params["shared_gate"]) * _swiglu(params["shared"], tokens)


def _dense_local(params, x, route):
    tokens = x.reshape(T, D)
    e_local = params["experts"]["gate"].shape[0]
    first = lax.axis_index("ep") * e_local
    top_w, top_i = route(params["router"], tokens)
    combine = jnp.einsum("tk,tke->te", top_w, jax.nn.one_hot(top_i - first, e_local))
    hidden = jax.nn.silu(jnp.einsum("td,edf->etf", tokens, params["experts"]["gate"]))
    hidden = hidden * jnp.einsum("td,edf->etf", tokens, params["experts"]["up"])
    routed = jnp.einsum("te,etf,efd->td", combine, hidden, params["experts"]["down"])
    return lax.psum(routed + _shared_partial(params, tokens), "ep").reshape(B, S, D)


def _run(local, params, x, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(_SPECS, P()), out_specs=P())(params, x)


def moe_ep_dense(params, x, mesh):
    return _run(lambda p, x: _dense_local(p, x, route=_route), params, x, mesh)


def moe_ep_dense_unnormalised(params, x, mesh):
    return _run(lambda p, x: _dense_local(p, x, route=_route_raw), params, x, mesh)


def _expert_rows(w, tokens, gate, expert_id, top_i, unsort):
    routed_here = jnp.any(top_i == expert_id, axis=-1)
    order = jnp.argsort(~routed_here, stable=True)
    y = _swiglu(w, tokens[order]) * gate[order][:, None]
    return unsort(order, y)


def _scatter_back(order, y):
    return jnp.zeros_like(y).at[order].add(y)


def _keep_sorted(order, rows):
    return rows


def _sorted_local(params, x, unsort):
    tokens = x.reshape(T, D)
    e_local = params["experts"]["gate"].shape[0]
    ids = lax.axis_index("ep") * e_local + jnp.arange(e_local)
    top_w, top_i = _route(params["router"], tokens)
    gates = jax.vmap(lambda e: jnp.sum(jnp.where(top_i == e, top_w, 0.0), axis=-1))(ids)
    per_expert = jax.vmap(lambda w, g, e: _expert_rows(w, tokens, g, e, top_i, unsort))(
        params["experts"], gates, ids)
    routed = jnp.sum(per_expert, axis=0)
    return lax.psum(routed + _shared_partial(params, tokens), "ep").reshape(B, S, D)


def moe_ep_sorted(params, x, mesh):
    return _run(lambda p, x: _sorted_local(p, x, _scatter_back), params, x, mesh)


def moe_ep_sorted_no_unsort(params, x, mesh):
    return _run(lambda p, x: _sorted_local(p, x, _keep_sorted), params, x, mesh)
