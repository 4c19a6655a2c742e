"""GShard-style top-1 MoE: tokens are split into groups (one per device), each group has its own
per-expert capacity; buckets travel to their expert's device and back with all_to_all."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

GROUPS, GROUP_SIZE, D, H, N_EXP, CAPACITY = 4, 4, 8, 16, 4, 2


def inputs():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((GROUPS * GROUP_SIZE, D), f32), jax.ShapeDtypeStruct((D, N_EXP), f32),
            jax.ShapeDtypeStruct((N_EXP, D, H), f32), jax.ShapeDtypeStruct((N_EXP, H, D), f32))


def group_dispatch(x, gate_w):
    """x [s, d] of one group -> combine weights [s, e, c] and 0/1 dispatch mask [s, e, c]."""
    probs = jax.nn.softmax(x @ gate_w, axis=-1)
    top = jnp.argmax(probs, axis=-1)
    mask = jax.nn.one_hot(top, N_EXP, dtype=x.dtype)
    pos = jnp.cumsum(mask, axis=0) * mask - 1.0          # slot within expert, -1 if not routed
    slots = jax.nn.one_hot(jnp.sum(pos * mask, axis=-1).astype(jnp.int32), CAPACITY, dtype=x.dtype)
    dispatch = mask[:, :, None] * slots[:, None, :]
    return dispatch * jnp.max(probs, axis=-1)[:, None, None], dispatch


def moe_groups(x, gate_w, w1, w2):
    xg = x.reshape(GROUPS, GROUP_SIZE, D)
    combine, dispatch = jax.vmap(group_dispatch, in_axes=(0, None))(xg, gate_w)
    buckets = jnp.einsum("gsec,gsd->egcd", dispatch, xg)
    out = jnp.einsum("egch,ehd->egcd", jax.nn.gelu(jnp.einsum("egcd,edh->egch", buckets, w1)), w2)
    return jnp.einsum("gsec,egcd->gsd", combine, out).reshape(-1, D)


def moe_groups_a2a(x, gate_w, w1, w2, mesh):
    def local(xg, gate_w, w1, w2):
        combine, dispatch = group_dispatch(xg, gate_w)
        buckets = jnp.einsum("sec,sd->ecd", dispatch, xg)              # [E, C, D] for my group
        buckets = lax.all_to_all(buckets, "exp", 0, 0, tiled=True)     # [G*E_loc, C, D]
        buckets = buckets.reshape(GROUPS, w1.shape[0], CAPACITY, D).swapaxes(0, 1)
        out = jnp.einsum("egch,ehd->egcd", jax.nn.gelu(jnp.einsum("egcd,edh->egch", buckets, w1)), w2)
        out = lax.all_to_all(out.swapaxes(0, 1).reshape(-1, CAPACITY, D), "exp", 0, 0, tiled=True)
        return jnp.einsum("sec,ecd->sd", combine, out)

    return jax.shard_map(local, mesh=mesh, in_specs=(P("exp"), P(), P("exp"), P("exp")),
                         out_specs=P("exp"))(x, gate_w, w1, w2)
