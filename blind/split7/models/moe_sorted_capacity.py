# Top-1 MoE with a per-expert capacity. Slots are assigned by a stable sort on the expert id
# (first come, first served); tokens past the capacity are dropped. Experts split over 'expert'.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

T, DM, DF, E, CAP = 12, 8, 8, 4, 4


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((T, DM), f), jax.ShapeDtypeStruct((DM, E), f),
            jax.ShapeDtypeStruct((E, DM, DF), f), jax.ShapeDtypeStruct((E, DF, DM), f))


def assign_slots(x, router):
    logits = x @ router
    expert = jnp.argmax(logits, axis=-1)
    gate = jax.nn.softmax(logits, axis=-1).max(axis=-1)
    order = jnp.argsort(expert, stable=True)
    sorted_expert = expert[order]
    one_hot_sorted = jax.nn.one_hot(sorted_expert, E, dtype=jnp.int32)
    slot_sorted = jnp.sum((jnp.cumsum(one_hot_sorted, axis=0) - 1) * one_hot_sorted, axis=-1)
    slot = jnp.zeros_like(slot_sorted).at[order].set(slot_sorted)
    return expert, slot, gate


def ffn(tokens, w_in, w_out):  # tokens [e, c, d]
    return jnp.einsum("ecf,efd->ecd", jax.nn.silu(jnp.einsum("ecd,edf->ecf", tokens, w_in)), w_out)


def moe(x, router, w_in, w_out):
    expert, slot, gate = assign_slots(x, router)
    dispatch = (jax.nn.one_hot(expert, E)[:, :, None] * jax.nn.one_hot(slot, CAP)[:, None, :])
    buckets = jnp.einsum("tec,td->ecd", dispatch, x)
    return jnp.einsum("tec,ecd->td", dispatch * gate[:, None, None], ffn(buckets, w_in, w_out))


def moe_ep(x, router, w_in, w_out, mesh):
    def per_shard(x, router, w_in, w_out):
        n_local = w_in.shape[0]
        expert, slot, gate = assign_slots(x, router)
        local_expert = expert - lax.axis_index("expert") * n_local
        dispatch = (jax.nn.one_hot(local_expert, n_local)[:, :, None]
                    * jax.nn.one_hot(slot, CAP)[:, None, :])
        buckets = jnp.einsum("tec,td->ecd", dispatch, x)
        y = jnp.einsum("tec,ecd->td", dispatch * gate[:, None, None], ffn(buckets, w_in, w_out))
        return lax.psum(y, "expert")

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P(), P("expert"), P("expert")),
                         out_specs=P())(x, router, w_in, w_out)


def moe_ep_local_ids(x, router, w_in, w_out, mesh):
    def per_shard(x, router, w_in, w_out):
        n_local = w_in.shape[0]
        expert, slot, gate = assign_slots(x, router)
        local_expert = expert - lax.axis_index("expert")
        dispatch = (jax.nn.one_hot(local_expert, n_local)[:, :, None]
                    * jax.nn.one_hot(slot, CAP)[:, None, :])
        buckets = jnp.einsum("tec,td->ecd", dispatch, x)
        y = jnp.einsum("tec,ecd->td", dispatch * gate[:, None, None], ffn(buckets, w_in, w_out))
        return lax.psum(y, "expert")

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P(), P("expert"), P("expert")),
                         out_specs=P())(x, router, w_in, w_out)
