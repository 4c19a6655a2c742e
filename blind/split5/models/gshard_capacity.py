# GShard-style top-1 MoE with a per-expert capacity: tokens past an expert's capacity are dropped
# (their output is zero). Dispatch and combine are one-hot [tokens, experts, capacity] tensors.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

T, D, F, E, CAP = 16, 8, 8, 4, 3


def shapes():
    sds = jax.ShapeDtypeStruct
    return (sds((T, D), jnp.float32), sds((D, E), jnp.float32),
            sds((E, D, F), jnp.float32), sds((E, F, D), jnp.float32))


def route(x, wg):
    probs = jax.nn.softmax(x @ wg, axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    gate = jnp.max(probs, axis=-1)
    onehot = jax.nn.one_hot(expert, E, dtype=jnp.int32)
    position = jnp.cumsum(onehot, axis=0) * onehot - 1
    kept = (position < CAP) & (onehot > 0)
    dispatch = jax.nn.one_hot(position, CAP) * kept[..., None]
    return dispatch, dispatch * gate[:, None, None]


def gshard_moe(x, wg, w1, w2):
    dispatch, combine = route(x, wg)
    expert_in = jnp.einsum("tec,td->ecd", dispatch, x)
    h = jax.nn.relu(jnp.einsum("ecd,edf->ecf", expert_in, w1))
    out = jnp.einsum("ecf,efd->ecd", h, w2)
    return jnp.einsum("tec,ecd->td", combine, out)


def gshard_moe_ep(x, wg, w1, w2):
    def per_device(x, wg, w1, w2):
        el = w1.shape[0]
        e0 = lax.axis_index("expert") * el
        dispatch, combine = route(x, wg)
        dispatch = lax.dynamic_slice_in_dim(dispatch, e0, el, axis=1)
        combine = lax.dynamic_slice_in_dim(combine, e0, el, axis=1)
        expert_in = jnp.einsum("tec,td->ecd", dispatch, x)
        h = jax.nn.relu(jnp.einsum("ecd,edf->ecf", expert_in, w1))
        out = jnp.einsum("ecf,efd->ecd", h, w2)
        return lax.psum(jnp.einsum("tec,ecd->td", combine, out), "expert")

    return jax.shard_map(per_device, in_specs=(P(), P(), P("expert"), P("expert")),
                         out_specs=P())(x, wg, w1, w2)


def gshard_moe_ep_bad_start(x, wg, w1, w2):
    def per_device(x, wg, w1, w2):
        el = w1.shape[0]
        e0 = lax.axis_index("expert")
        dispatch, combine = route(x, wg)
        dispatch = lax.dynamic_slice_in_dim(dispatch, e0, el, axis=1)
        combine = lax.dynamic_slice_in_dim(combine, e0, el, axis=1)
        expert_in = jnp.einsum("tec,td->ecd", dispatch, x)
        h = jax.nn.relu(jnp.einsum("ecd,edf->ecf", expert_in, w1))
        out = jnp.einsum("ecf,efd->ecd", h, w2)
        return lax.psum(jnp.einsum("tec,ecd->td", combine, out), "expert")

    return jax.shard_map(per_device, in_specs=(P(), P(), P("expert"), P("expert")),
                         out_specs=P())(x, wg, w1, w2)
