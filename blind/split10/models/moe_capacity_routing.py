"""Mixture-of-experts FFN layers with capacity-limited routing, expert-parallel.

Switch (top-1) routing over the whole batch with experts sliced per device (tokens broadcast, psum
combine), and GShard-style top-2 routing per token group with an all_to_all exchange.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, F = 16, 32


def _expert_ffn(x, w_in, w_out):
    # x: [experts, ..., D]; weights stacked over experts
    return jnp.einsum("e...f,efd->e...d", jax.nn.relu(jnp.einsum("e...d,edf->e...f", x, w_in)), w_out)


# ---- Switch top-1 over all tokens, experts sliced per device ----------------------------------

N1, E1, C1 = 16, 8, 3


def switch_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(N1, D), {"router": f(D, E1), "w_in": f(E1, D, F), "w_out": f(E1, F, D)}


def switch_dispatch(x, router):
    probs = jax.nn.softmax(x @ router, axis=-1)
    choice = jax.nn.one_hot(jnp.argmax(probs, axis=-1), E1, dtype=x.dtype)   # [N, E]
    slot = jnp.sum(jnp.cumsum(choice, axis=0) * choice, axis=-1) - 1        # [N]
    dispatch = choice[:, :, None] * jax.nn.one_hot(slot, C1, dtype=x.dtype)[:, None, :]
    return dispatch, dispatch * jnp.max(probs, axis=-1)[:, None, None]       # [N, E, C]


def switch_layer(x, p):
    dispatch, combine = switch_dispatch(x, p["router"])
    expert_in = jnp.einsum("nec,nd->ecd", dispatch, x)
    return jnp.einsum("nec,ecd->nd", combine, _expert_ffn(expert_in, p["w_in"], p["w_out"]))


def _switch_local(first_expert):
    def local(x, p):
        dispatch, combine = switch_dispatch(x, p["router"])
        n_local = p["w_in"].shape[0]
        e0 = first_expert(n_local)
        dispatch = lax.dynamic_slice_in_dim(dispatch, e0, n_local, axis=1)
        combine = lax.dynamic_slice_in_dim(combine, e0, n_local, axis=1)
        y = _expert_ffn(jnp.einsum("nec,nd->ecd", dispatch, x), p["w_in"], p["w_out"])
        return lax.psum(jnp.einsum("nec,ecd->nd", combine, y), "expert")
    return local


_SWITCH_SPECS = {"router": P(), "w_in": P("expert"), "w_out": P("expert")}


def switch_layer_ep(x, p, mesh):
    local = _switch_local(lambda n_local: lax.axis_index("expert") * n_local)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), _SWITCH_SPECS), out_specs=P())(x, p)


def switch_layer_ep_offset(x, p, mesh):
    local = _switch_local(lambda n_local: lax.axis_index("expert"))
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), _SWITCH_SPECS), out_specs=P())(x, p)


# ---- GShard top-2 per group, all_to_all between groups and experts ----------------------------

G2, S2, E2, C2 = 4, 8, 4, 4


def gshard_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(G2, S2, D), {"wg": f(D, E2), "wi": f(E2, D, F), "wo": f(E2, F, D)}


def top2_masks(xg, wg):
    """xg: [g, S, D] -> dispatch [g, S, E, C] (0/1) and combine [g, S, E, C] (gate weights)."""
    gates = jax.nn.softmax(jnp.einsum("gsd,de->gse", xg, wg), axis=-1)
    first = jax.nn.one_hot(jnp.argmax(gates, -1), E2, dtype=gates.dtype)
    second = jax.nn.one_hot(jnp.argmax(gates * (1 - first), -1), E2, dtype=gates.dtype)
    pos1 = jnp.cumsum(first, axis=1) - first
    pos2 = jnp.cumsum(second, axis=1) - second + jnp.sum(first, axis=1, keepdims=True)
    g1 = jnp.sum(gates * first, -1, keepdims=True)
    g2 = jnp.sum(gates * second, -1, keepdims=True)
    g1, g2 = g1 / (g1 + g2), g2 / (g1 + g2)
    slot1 = jax.nn.one_hot(jnp.sum(pos1 * first, -1), C2, dtype=gates.dtype)
    slot2 = jax.nn.one_hot(jnp.sum(pos2 * second, -1), C2, dtype=gates.dtype)
    d1 = first[..., None] * slot1[:, :, None, :]
    d2 = second[..., None] * slot2[:, :, None, :]
    return d1 + d2, g1[..., None] * d1 + g2[..., None] * d2


def gshard_layer(x, p):
    dispatch, combine = top2_masks(x, p["wg"])
    expert_in = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    return jnp.einsum("gsec,egcd->gsd", combine, _expert_ffn(expert_in, p["wi"], p["wo"]))


def _gshard_local(x, p, weights_of):
    dispatch, combine = top2_masks(x, p["wg"])
    expert_in = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    expert_in = lax.all_to_all(expert_in, "ep", split_axis=0, concat_axis=1, tiled=True)
    y = _expert_ffn(expert_in, p["wi"], p["wo"])
    y = lax.all_to_all(y, "ep", split_axis=1, concat_axis=0, tiled=True)
    return jnp.einsum("gsec,egcd->gsd", weights_of(dispatch, combine), y)


_GSHARD_SPECS = {"wg": P(), "wi": P("ep"), "wo": P("ep")}


def gshard_layer_a2a(x, p, mesh):
    local = lambda x, p: _gshard_local(x, p, lambda dispatch, combine: combine)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("ep"), _GSHARD_SPECS),
                         out_specs=P("ep"))(x, p)


def gshard_layer_a2a_unweighted(x, p, mesh):
    local = lambda x, p: _gshard_local(x, p, lambda dispatch, combine: dispatch)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("ep"), _GSHARD_SPECS),
                         out_specs=P("ep"))(x, p)
