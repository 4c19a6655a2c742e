"""Expert parallelism: a top-1 mixture-of-experts layer with one expert per device.

Tokens are split across `ep`. Each device routes its tokens, packs them into per-expert
buffers (capacity = local tokens, so nothing is dropped), all_to_all sends every buffer to
the device owning that expert, the expert MLP runs, and a second all_to_all brings the
results back to the tokens' devices, where they are weighted by the router probability.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import spec

T, D, F, E = 16, 16, 32, 4
EP = "ep"


def _expert(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


def moe(x, w_router, w1, w2):
    probs = jax.nn.softmax(x @ w_router, axis=-1)  # (T, E)
    choice = jnp.argmax(probs, axis=-1)
    gate = jnp.take_along_axis(probs, choice[:, None], axis=-1)  # (T, 1)
    outs = jax.vmap(_expert, in_axes=(None, 0, 0))(x, w1, w2)  # (E, T, D): every expert, dense
    picked = jnp.take_along_axis(outs, choice[None, :, None], axis=0)[0]  # (T, D)
    return gate * picked


def inputs():
    return (spec(T, D), spec(D, E), spec(E, D, F), spec(E, F, D))


def _dispatch_mask(choice, n_experts):
    """(T_local, E, C) one-hot: token t goes to slot c of expert e (C = T_local)."""
    onehot = jax.nn.one_hot(choice, n_experts, dtype=jnp.int32)  # (T, E)
    slot = jnp.cumsum(onehot, axis=0) * onehot - 1  # position among the tokens of its expert
    return jax.nn.one_hot(slot, choice.shape[0], dtype=jnp.float32) * onehot[..., None]


def _moe_ep(x, w_router, w1, w2, mesh, combine):
    n_experts = w_router.shape[1]

    def body(x, w_router, w1, w2):  # x: (T / ep, D); w1, w2: this device's expert
        probs = jax.nn.softmax(x @ w_router, axis=-1)
        choice = jnp.argmax(probs, axis=-1)
        gate = jnp.take_along_axis(probs, choice[:, None], axis=-1)
        dispatch = _dispatch_mask(choice, n_experts)  # (T_l, E, C)
        buffers = jnp.einsum("tec,td->ecd", dispatch, x)  # (E, C, D)
        received = lax.all_to_all(buffers, EP, split_axis=0, concat_axis=0, tiled=True)  # (src, C, D)
        y = _expert(received, w1[0], w2[0])
        return combine(y, dispatch) * gate

    return jax.shard_map(
        body, mesh=mesh, in_specs=(P(EP), P(), P(EP), P(EP)), out_specs=P(EP),
    )(x, w_router, w1, w2)


def moe_ep(x, w_router, w1, w2, *, mesh):
    def combine(y, dispatch):
        back = lax.all_to_all(y, EP, split_axis=0, concat_axis=0, tiled=True)  # (E, C, D)
        return jnp.einsum("tec,ecd->td", dispatch, back)

    return _moe_ep(x, w_router, w1, w2, mesh, combine)


def moe_ep_no_return_all_to_all(x, w_router, w1, w2, *, mesh):
    def combine(y, dispatch):
        return jnp.einsum("tec,ecd->td", dispatch, y)  # BUG: combines without the return all_to_all: y holds other devices' tokens

    return _moe_ep(x, w_router, w1, w2, mesh, combine)
