"""Switch-style top-1 MoE with a per-group expert capacity (tokens over capacity are dropped and
pass through the residual). Tokens are split into groups; in the expert-parallel version each
device holds one group and some experts, and all_to_all moves the dispatched slots between them."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

GROUPS, GROUP_TOKENS, D, H, E = 4, 8, 8, 16, 4
CAPACITY = 2  # GROUP_TOKENS / E


def dispatch_masks(x, w_gate):
    """x: [t, d] one group -> dispatch [t, e, c] (0/1) and combine [t, e, c] (gate weights)."""
    probs = jax.nn.softmax(x @ w_gate, axis=-1)
    choice = jnp.argmax(probs, axis=-1)
    gate = jnp.max(probs, axis=-1)
    onehot = jax.nn.one_hot(choice, E, dtype=x.dtype)  # [t, e]
    slot = jnp.cumsum(onehot, axis=0) - 1.0
    slot = jnp.sum(slot * onehot, axis=-1).astype(jnp.int32)  # [t]
    kept = (slot < CAPACITY).astype(x.dtype)
    dispatch = onehot[:, :, None] * jax.nn.one_hot(slot, CAPACITY, dtype=x.dtype)[:, None, :] * kept[:, None, None]
    return dispatch, dispatch * gate[:, None, None]


def experts(slots, w1, w2):
    """slots: [..., e, c, d] with the e experts of w1/w2."""
    h = jax.nn.gelu(jnp.einsum("...ecd,edh->...ech", slots, w1))
    return jnp.einsum("...ech,ehd->...ecd", h, w2)


def switch_layer(x, w_gate, w1, w2):
    def one_group(xg):
        dispatch, combine = dispatch_masks(xg, w_gate)
        slots = jnp.einsum("tec,td->ecd", dispatch, xg)
        return xg + jnp.einsum("tec,ecd->td", combine, experts(slots, w1, w2))

    groups = x.reshape(GROUPS, GROUP_TOKENS, D)
    return jax.vmap(one_group)(groups).reshape(GROUPS * GROUP_TOKENS, D)


def switch_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((GROUPS * GROUP_TOKENS, D), f32),
        jax.ShapeDtypeStruct((D, E), f32),
        jax.ShapeDtypeStruct((E, D, H), f32),
        jax.ShapeDtypeStruct((E, H, D), f32),
    )


def switch_layer_a2a(x, w_gate, w1, w2, mesh):
    ep = mesh.shape["ep"]

    def device(xg, wg, w1_local, w2_local):
        dispatch, combine = dispatch_masks(xg, wg)
        slots = jnp.einsum("tec,td->ecd", dispatch, xg)  # [E, C, D] for this group
        slots = slots.reshape(ep, E // ep, CAPACITY, D)
        slots = lax.all_to_all(slots, "ep", split_axis=0, concat_axis=0, tiled=True)  # [groups, e_loc, C, D]
        out = experts(slots, w1_local, w2_local)
        out = lax.all_to_all(out, "ep", split_axis=0, concat_axis=0, tiled=True)
        out = out.reshape(E, CAPACITY, D)
        return xg + jnp.einsum("tec,ecd->td", combine, out)

    return jax.shard_map(device, mesh=mesh, in_specs=(P("ep"), P(), P("ep"), P("ep")), out_specs=P("ep"))(
        x, w_gate, w1, w2
    )


def _dispatch_masks_inclusive(x, w_gate):
    probs = jax.nn.softmax(x @ w_gate, axis=-1)
    choice = jnp.argmax(probs, axis=-1)
    gate = jnp.max(probs, axis=-1)
    onehot = jax.nn.one_hot(choice, E, dtype=x.dtype)
    slot = jnp.cumsum(onehot, axis=0)
    slot = jnp.sum(slot * onehot, axis=-1).astype(jnp.int32)
    kept = (slot < CAPACITY).astype(x.dtype)
    dispatch = onehot[:, :, None] * jax.nn.one_hot(slot, CAPACITY, dtype=x.dtype)[:, None, :] * kept[:, None, None]
    return dispatch, dispatch * gate[:, None, None]


def switch_layer_a2a_slot_off_by_one(x, w_gate, w1, w2, mesh):
    ep = mesh.shape["ep"]

    def device(xg, wg, w1_local, w2_local):
        dispatch, combine = _dispatch_masks_inclusive(xg, wg)
        slots = jnp.einsum("tec,td->ecd", dispatch, xg)
        slots = slots.reshape(ep, E // ep, CAPACITY, D)
        slots = lax.all_to_all(slots, "ep", split_axis=0, concat_axis=0, tiled=True)
        out = experts(slots, w1_local, w2_local)
        out = lax.all_to_all(out, "ep", split_axis=0, concat_axis=0, tiled=True)
        out = out.reshape(E, CAPACITY, D)
        return xg + jnp.einsum("tec,ecd->td", combine, out)

    return jax.shard_map(device, mesh=mesh, in_specs=(P("ep"), P(), P("ep"), P("ep")), out_specs=P("ep"))(
        x, w_gate, w1, w2
    )
