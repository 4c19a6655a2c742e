"""Mixture-of-experts feed-forward layers with expert parallelism over the `ep` mesh axis."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, F = 16, 32

# ---------------------------------------------------------------- top-k, tokens broadcast
N_EXPERTS, TOP_K = 8, 2


def _combine_weights(probs):
    top_p, top_i = lax.top_k(probs, TOP_K)
    top_p = top_p / top_p.sum(-1, keepdims=True)
    return jnp.einsum("tk,tke->te", top_p, jax.nn.one_hot(top_i, probs.shape[-1]))


def _expert_ffn(x, w1, w2):
    h = jax.nn.gelu(jnp.einsum("td,edf->tef", x, w1))
    return jnp.einsum("tef,efd->ted", h, w2)


def moe_topk(params, x):
    b, s, _ = x.shape
    tokens = x.reshape(b * s, D)
    combine = _combine_weights(jax.nn.softmax(tokens @ params["router"], axis=-1))
    y = jnp.einsum("te,ted->td", combine, _expert_ffn(tokens, params["w1"], params["w2"]))
    return y.reshape(b, s, D)


def moe_topk_inputs():
    f32 = jnp.float32
    return ({"router": jax.ShapeDtypeStruct((D, N_EXPERTS), f32),
             "w1": jax.ShapeDtypeStruct((N_EXPERTS, D, F), f32),
             "w2": jax.ShapeDtypeStruct((N_EXPERTS, F, D), f32)},
            jax.ShapeDtypeStruct((2, 8, D), f32))


def moe_topk_ep(params, x, mesh):
    specs = {"router": P(), "w1": P("ep"), "w2": P("ep")}

    @jax.shard_map(mesh=mesh, in_specs=(specs, P()), out_specs=P())
    def layer(p, x):
        b, s, _ = x.shape
        tokens = x.reshape(b * s, D)
        combine = _combine_weights(jax.nn.softmax(tokens @ p["router"], axis=-1))
        n_local = p["w1"].shape[0]
        mine = lax.dynamic_slice_in_dim(combine, lax.axis_index("ep") * n_local, n_local, axis=1)
        y = jnp.einsum("te,ted->td", mine, _expert_ffn(tokens, p["w1"], p["w2"]))
        return lax.psum(y, "ep").reshape(b, s, D)

    return layer(params, x)


def moe_topk_ep_sharded_router(params, x, mesh):
    """The router's columns live with their experts; logits are gathered before top-k."""
    specs = {"router": P(None, "ep"), "w1": P("ep"), "w2": P("ep")}

    @jax.shard_map(mesh=mesh, in_specs=(specs, P()), out_specs=P())
    def layer(p, x):
        b, s, _ = x.shape
        tokens = x.reshape(b * s, D)
        local_probs = jax.nn.softmax(tokens @ p["router"], axis=-1)
        combine = _combine_weights(lax.all_gather(local_probs, "ep", axis=1, tiled=True))
        n_local = p["w1"].shape[0]
        mine = lax.dynamic_slice_in_dim(combine, lax.axis_index("ep") * n_local, n_local, axis=1)
        y = jnp.einsum("te,ted->td", mine, _expert_ffn(tokens, p["w1"], p["w2"]))
        return lax.psum(y, "ep").reshape(b, s, D)

    return layer(params, x)


# ---------------------------------------------------------------- Switch top-1 with capacity
SWITCH_EXPERTS, GROUPS, CAPACITY_FACTOR, SWITCH_TOKENS = 8, 4, 1.0, 64


def _capacity(tokens_per_group):
    return max(1, int(tokens_per_group * CAPACITY_FACTOR / SWITCH_EXPERTS))


def _switch_dispatch(x, router, capacity):
    """GShard dispatch/combine tensors [t, E, C] for one group of tokens."""
    probs = jax.nn.softmax(x @ router, axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    gate = jnp.max(probs, axis=-1)
    onehot = jax.nn.one_hot(expert, SWITCH_EXPERTS, dtype=jnp.int32)
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)
    slot = jax.nn.one_hot(position, capacity) * (position < capacity)[:, None]
    dispatch = onehot[:, :, None].astype(jnp.float32) * slot[:, None, :]
    return dispatch, dispatch * gate[:, None, None]


def _slot_ffn(xin, w1, w2):
    h = jax.nn.relu(jnp.einsum("...ecd,edf->...ecf", xin, w1))
    return jnp.einsum("...ecf,efd->...ecd", h, w2)


def switch(params, x):
    groups = x.reshape(GROUPS, -1, D)

    def one_group(xg):
        dispatch, combine = _switch_dispatch(xg, params["router"], _capacity(xg.shape[0]))
        xin = jnp.einsum("tec,td->ecd", dispatch, xg)
        return jnp.einsum("tec,ecd->td", combine, _slot_ffn(xin, params["w1"], params["w2"]))

    return jax.vmap(one_group)(groups).reshape(-1, D)


def switch_inputs():
    f32 = jnp.float32
    return ({"router": jax.ShapeDtypeStruct((D, SWITCH_EXPERTS), f32),
             "w1": jax.ShapeDtypeStruct((SWITCH_EXPERTS, D, F), f32),
             "w2": jax.ShapeDtypeStruct((SWITCH_EXPERTS, F, D), f32)},
            jax.ShapeDtypeStruct((SWITCH_TOKENS, D), f32))


def _switch_ep(params, x, mesh, capacity):
    n = mesh.shape["ep"]

    def body(router, w1, w2, x):
        dispatch, combine = _switch_dispatch(x, router, capacity)
        xin = jnp.einsum("tec,td->ecd", dispatch, x)
        xin = xin.reshape(n, SWITCH_EXPERTS // n, capacity, D)
        xin = lax.all_to_all(xin, "ep", split_axis=0, concat_axis=0, tiled=True)
        out = _slot_ffn(xin, w1, w2)
        out = lax.all_to_all(out, "ep", split_axis=0, concat_axis=0, tiled=True)
        out = out.reshape(SWITCH_EXPERTS, capacity, D)
        return jnp.einsum("tec,ecd->td", combine, out)

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(), P("ep"), P("ep"), P("ep")),
                       out_specs=P("ep"))
    return fn(params["router"], params["w1"], params["w2"], x)


def switch_ep(params, x, mesh):
    capacity = _capacity(x.shape[0] // mesh.shape["ep"])
    return _switch_ep(params, x, mesh, capacity)


def switch_ep_v2(params, x, mesh):
    capacity = _capacity(x.shape[0])
    return _switch_ep(params, x, mesh, capacity)


# ---------------------------------------------------------------- sorted dispatch, ragged_dot
SORT_EXPERTS, SORT_TOKENS = 4, 32


def _top1(x, router):
    logits = x @ router
    expert = jnp.argmax(logits, axis=-1)
    gate = jnp.take_along_axis(jax.nn.softmax(logits, -1), expert[:, None], axis=-1)
    return expert, gate


def moe_sorted(params, x):
    expert, gate = _top1(x, params["router"])
    order = jnp.argsort(expert, stable=True)
    sizes = jnp.bincount(expert, length=SORT_EXPERTS)
    h = jax.nn.silu(lax.ragged_dot(x[order], params["w1"], sizes))
    ys = lax.ragged_dot(h, params["w2"], sizes)
    return jnp.zeros_like(ys).at[order].set(ys) * gate


def moe_sorted_inputs():
    f32 = jnp.float32
    return ({"router": jax.ShapeDtypeStruct((D, SORT_EXPERTS), f32),
             "w1": jax.ShapeDtypeStruct((SORT_EXPERTS, D, F), f32),
             "w2": jax.ShapeDtypeStruct((SORT_EXPERTS, F, D), f32)},
            jax.ShapeDtypeStruct((SORT_TOKENS, D), f32))


def _local_expert_rows(x, w1, w2, sizes, order):
    """Run this rank's experts on their contiguous run of the sorted tokens (zeros elsewhere)."""
    n_local = w1.shape[0]
    first = lax.axis_index("ep") * n_local
    local_sizes = lax.dynamic_slice_in_dim(sizes, first, n_local)
    offset = jnp.sum(jnp.where(jnp.arange(sizes.shape[0]) < first, sizes, 0))
    xs = jnp.roll(x[order], -offset, axis=0)
    h = jax.nn.silu(lax.ragged_dot(xs, w1, local_sizes))
    return jnp.roll(lax.ragged_dot(h, w2, local_sizes), offset, axis=0)


def moe_sorted_ep(params, x, mesh):
    def body(router, w1, w2, x):
        expert, gate = _top1(x, router)
        order = jnp.argsort(expert, stable=True)
        sizes = jnp.bincount(expert, length=SORT_EXPERTS)
        ys = _local_expert_rows(x, w1, w2, sizes, order)
        y = jnp.zeros_like(ys).at[order].set(ys)
        return lax.psum(y, "ep") * gate

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(), P("ep"), P("ep"), P()), out_specs=P())
    return fn(params["router"], params["w1"], params["w2"], x)


def moe_sorted_ep_gather(params, x, mesh):
    def body(router, w1, w2, x):
        expert, gate = _top1(x, router)
        order = jnp.argsort(expert, stable=True)
        sizes = jnp.bincount(expert, length=SORT_EXPERTS)
        ys = _local_expert_rows(x, w1, w2, sizes, order)
        y = ys[order]
        return lax.psum(y, "ep") * gate

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(), P("ep"), P("ep"), P()), out_specs=P())
    return fn(params["router"], params["w1"], params["w2"], x)
