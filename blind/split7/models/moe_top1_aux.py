"""Switch-style top-1 MoE layer with a load-balancing auxiliary loss.

Tokens are split over 'ep' (which also holds one expert per device). Each device gathers all tokens,
runs its own experts on them, and reduce-scatters the combined outputs back to the token shards.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOKENS, D, FF, N_EXPERTS = 16, 8, 16, 4


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((TOKENS, D), f), jax.ShapeDtypeStruct((D, N_EXPERTS), f),
            jax.ShapeDtypeStruct((N_EXPERTS, D, FF), f), jax.ShapeDtypeStruct((N_EXPERTS, FF, D), f))


def route(x, w_router):
    probs = jax.nn.softmax(x @ w_router, axis=-1)
    choice = jnp.argmax(probs, axis=-1)
    gate = jnp.max(probs, axis=-1)
    return probs, jax.nn.one_hot(choice, N_EXPERTS, dtype=x.dtype), gate


def expert_ffn(x, w1, w2):
    return jnp.einsum("etf,efd->etd", jax.nn.relu(jnp.einsum("td,edf->etf", x, w1)), w2)


def switch_layer(x, w_router, w1, w2):
    probs, assign, gate = route(x, w_router)
    y = jnp.einsum("te,etd->td", assign * gate[:, None], expert_ffn(x, w1, w2))
    aux = N_EXPERTS * jnp.sum(jnp.mean(assign, axis=0) * jnp.mean(probs, axis=0))
    return y, aux


def _switch_ep(x, w_router, w1, w2, mesh, balance_fn):
    def shard(x_loc, w_router, w1_loc, w2_loc):
        e_loc = w1_loc.shape[0]
        x_all = lax.all_gather(x_loc, "ep", tiled=True)
        _, assign, gate = route(x_all, w_router)
        mine = lax.dynamic_slice_in_dim(assign * gate[:, None], lax.axis_index("ep") * e_loc, e_loc, 1)
        y = jnp.einsum("te,etd->td", mine, expert_ffn(x_all, w1_loc, w2_loc))
        y = lax.psum_scatter(y, "ep", tiled=True)
        probs_loc, assign_loc, _ = route(x_loc, w_router)
        return y, balance_fn(probs_loc, assign_loc)

    return jax.shard_map(shard, mesh=mesh, in_specs=(P("ep"), P(), P("ep"), P("ep")),
                         out_specs=(P("ep"), P()), check_vma=False)(x, w_router, w1, w2)


def switch_layer_ep(x, w_router, w1, w2, mesh):
    def balance(probs, assign):
        frac = lax.pmean(jnp.mean(assign, axis=0), "ep")
        mean_prob = lax.pmean(jnp.mean(probs, axis=0), "ep")
        return N_EXPERTS * jnp.sum(frac * mean_prob)

    return _switch_ep(x, w_router, w1, w2, mesh, balance)


def switch_layer_ep_local_frac(x, w_router, w1, w2, mesh):
    def balance(probs, assign):
        frac = jnp.mean(assign, axis=0)
        mean_prob = lax.pmean(jnp.mean(probs, axis=0), "ep")
        return N_EXPERTS * jnp.sum(frac * mean_prob)

    return _switch_ep(x, w_router, w1, w2, mesh, balance)
