"""Grok-style top-2 mixture of experts with capacity drop: router logits -> `lax.top_k` -> softmax over
the two chosen logits; assignments are queued top-1 choices first (GShard priority), an expert keeps
its first CAPACITY assignments and drops the rest; experts are GELU MLPs. 4 experts, one per device
on {ep: 4}.

- `moe_replicated_tokens`: tokens replicated, every device builds the routing and applies its own
  expert densely to the tokens it kept, outputs summed by `psum`;
- `moe_dispatch_combine`: tokens sharded over `ep`, all-gathered for routing, each device builds
  dispatch / combine tensors [K*T, CAPACITY] for its expert, runs the expert on its [CAPACITY, D]
  buffer and `psum_scatter`s the combined output back to token shards.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

T, D, F, E, K = 16, 16, 32, 4, 2
CAPACITY = 6
EP = 4


def moe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"router": f(D, E), "w_in": f(E, D, F), "w_out": f(E, F, D)}, f(T, D)


def _expert(w_in, w_out, x):
    return jax.nn.gelu(x @ w_in) @ w_out


def route(router, x, kept):
    """gates [K, T], expert ids [K, T], queue positions [K, T], kept mask [K, T]."""
    vals, experts = lax.top_k(x @ router, K)
    gates = jax.nn.softmax(vals, axis=-1).T
    experts = experts.T
    onehot = jax.nn.one_hot(experts, E, dtype=jnp.int32).reshape(K * T, E)
    pos = (jnp.cumsum(onehot, axis=0) - 1).reshape(K, T, E)
    pos = jnp.sum(pos * onehot.reshape(K, T, E), axis=-1)
    return gates, experts, pos, kept(pos)


def _within_capacity(pos):
    return pos < CAPACITY


def _within_capacity_inclusive(pos):
    return pos <= CAPACITY


def moe(params, x):
    gates, experts, _, keep = route(params["router"], x, _within_capacity)
    y = jnp.zeros_like(x)
    for e in range(E):
        weight = jnp.sum(jnp.where((experts == e) & keep, gates, 0.0), axis=0)
        y = y + weight[:, None] * _expert(params["w_in"][e], params["w_out"][e], x)
    return y


EXPERT_SPECS = {"router": P(), "w_in": P("ep"), "w_out": P("ep")}


# ---- replicated tokens, dense per-device expert ---------------------------------------------------

def _dense_local(params, x, kept):
    me = lax.axis_index("ep")
    gates, experts, _, keep = route(params["router"], x, kept)
    weight = jnp.sum(jnp.where((experts == me) & keep, gates, 0.0), axis=0)
    return lax.psum(weight[:, None] * _expert(params["w_in"][0], params["w_out"][0], x), "ep")


def _replicated(kept, params, x, mesh):
    return jax.shard_map(lambda p, x: _dense_local(p, x, kept), mesh=mesh,
                         in_specs=(EXPERT_SPECS, P()), out_specs=P(), check_vma=False)(params, x)


def moe_replicated_tokens(params, x, mesh):
    return _replicated(_within_capacity, params, x, mesh)


def moe_replicated_tokens_capacity_inclusive(params, x, mesh):
    return _replicated(_within_capacity_inclusive, params, x, mesh)


# ---- dispatch / combine einsums -----------------------------------------------------------------

def _dispatch_combine_local(params, x_shard, weighted):
    x = lax.all_gather(x_shard, "ep", axis=0, tiled=True)
    me = lax.axis_index("ep")
    gates, experts, pos, keep = route(params["router"], x, _within_capacity)
    mine = ((experts == me) & keep).reshape(K * T)
    dispatch = jax.nn.one_hot(pos.reshape(K * T), CAPACITY) * mine[:, None]
    x_rep = jnp.tile(x, (K, 1))
    buf = jnp.einsum("nc,nd->cd", dispatch, x_rep)
    out = _expert(params["w_in"][0], params["w_out"][0], buf)
    combine = weighted(dispatch, gates.reshape(K * T))
    y = jnp.einsum("nc,cd->nd", combine, out).reshape(K, T, D).sum(axis=0)
    return lax.psum_scatter(y, "ep", scatter_dimension=0, tiled=True)


def _gate_weighted(dispatch, gates):
    return dispatch * gates[:, None]


def _unweighted(dispatch, gates):
    return dispatch


def _dispatched(weighted, params, x, mesh):
    return jax.shard_map(lambda p, x: _dispatch_combine_local(p, x, weighted), mesh=mesh,
                         in_specs=(EXPERT_SPECS, P("ep")), out_specs=P("ep"),
                         check_vma=False)(params, x)


def moe_dispatch_combine(params, x, mesh):
    return _dispatched(_gate_weighted, params, x, mesh)


def moe_dispatch_combine_ungated(params, x, mesh):
    return _dispatched(_unweighted, params, x, mesh)
