"""Mixtral-style top-2 MoE with SwiGLU experts.

Distributed: mesh (dp, ep); tokens split over dp, experts over ep; every ep shard sees all tokens
of its dp shard, runs only its own experts and the partial outputs are summed over ep.
"""
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

N_EXP, TOP_K, D, F = 4, 2, 8, 12


def io_shapes():
    s = jax.ShapeDtypeStruct
    return (s((16, D), jnp.float32), s((D, N_EXP), jnp.float32),
            s((N_EXP, D, F), jnp.float32), s((N_EXP, D, F), jnp.float32), s((N_EXP, F, D), jnp.float32))


def moe(x, router, w_gate, w_up, w_down):
    logits = x @ router
    top_logits, top_ids = jax.lax.top_k(logits, TOP_K)
    weights = jax.nn.softmax(top_logits, axis=-1)
    dense_w = jnp.zeros_like(logits).at[jnp.arange(x.shape[0])[:, None], top_ids].add(weights)
    hidden = jax.nn.silu(jnp.einsum("td,edf->etf", x, w_gate)) * jnp.einsum("td,edf->etf", x, w_up)
    y = jnp.einsum("etf,efd->etd", hidden, w_down)
    return jnp.einsum("te,etd->td", dense_w, y)


def _gates(logits):
    vals, ids = jax.lax.top_k(logits, TOP_K)
    return jax.nn.softmax(vals, axis=-1), ids


def _gates_v2(logits):
    vals, ids = jax.lax.top_k(logits, TOP_K)
    return jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), ids, axis=-1), ids


def _local_experts(x, router, w_gate, w_up, w_down, *, gates_fn):
    n_local = w_gate.shape[0]
    first = jax.lax.axis_index("ep") * n_local
    gates, ids = gates_fn(x @ router)
    out = jnp.zeros_like(x)
    for e in range(n_local):
        g = jnp.sum(jnp.where(ids == first + e, gates, 0.0), axis=-1, keepdims=True)
        h = jax.nn.silu(x @ w_gate[e]) * (x @ w_up[e])
        out = out + g * (h @ w_down[e])
    return jax.lax.psum(out, "ep")


def _moe_ep(x, router, w_gate, w_up, w_down, mesh, gates_fn):
    e_spec = P("ep")
    fn = jax.shard_map(functools.partial(_local_experts, gates_fn=gates_fn), mesh=mesh,
                       in_specs=(P("dp"), P(), e_spec, e_spec, e_spec), out_specs=P("dp"))
    return fn(x, router, w_gate, w_up, w_down)


def moe_ep(x, router, w_gate, w_up, w_down, mesh):
    return _moe_ep(x, router, w_gate, w_up, w_down, mesh, _gates)


def moe_ep_softmax_all(x, router, w_gate, w_up, w_down, mesh):
    return _moe_ep(x, router, w_gate, w_up, w_down, mesh, _gates_v2)
