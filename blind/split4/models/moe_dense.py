"""Top-2 mixture of experts with dense (masked) dispatch; experts split across the 'expert' axis,
tokens replicated, outputs summed over the axis."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_TOK, D, F, N_EXP, TOP_K = 12, 8, 16, 8, 2


def moe_specs():
    f = jnp.float32
    return ({"router": jax.ShapeDtypeStruct((D, N_EXP), f),
             "up": jax.ShapeDtypeStruct((N_EXP, D, F), f),
             "down": jax.ShapeDtypeStruct((N_EXP, F, D), f)},
            jax.ShapeDtypeStruct((N_TOK, D), f))


def combine_weights(x, router):
    probs = jax.nn.softmax(x @ router, axis=-1)
    top_p, top_i = lax.top_k(probs, TOP_K)
    top_p = top_p / top_p.sum(-1, keepdims=True)
    return jnp.sum(jax.nn.one_hot(top_i, N_EXP) * top_p[..., None], axis=1)  # [tokens, experts]


def run_experts(x, up, down):
    return jnp.einsum("tef,efd->ted",
                      jax.nn.gelu(jnp.einsum("td,edf->tef", x, up)), down)


def moe(params, x):
    cw = combine_weights(x, params["router"])
    return jnp.einsum("te,ted->td", cw, run_experts(x, params["up"], params["down"]))


def moe_ep(params, x, mesh):
    def shard(params, x):
        n_local = params["up"].shape[0]
        cw = combine_weights(x, params["router"])
        cw_local = lax.dynamic_slice_in_dim(cw, lax.axis_index("expert") * n_local, n_local, axis=1)
        y = jnp.einsum("te,ted->td", cw_local, run_experts(x, params["up"], params["down"]))
        return lax.psum(y, "expert")

    specs = {"router": P(), "up": P("expert"), "down": P("expert")}
    return jax.shard_map(shard, mesh=mesh, in_specs=(specs, P()), out_specs=P())(params, x)


def moe_ep_unscaled_offset(params, x, mesh):
    def shard(params, x):
        n_local = params["up"].shape[0]
        cw = combine_weights(x, params["router"])
        cw_local = lax.dynamic_slice_in_dim(cw, lax.axis_index("expert"), n_local, axis=1)
        y = jnp.einsum("te,ted->td", cw_local, run_experts(x, params["up"], params["down"]))
        return lax.psum(y, "expert")

    specs = {"router": P(), "up": P("expert"), "down": P("expert")}
    return jax.shard_map(shard, mesh=mesh, in_specs=(specs, P()), out_specs=P())(params, x)
