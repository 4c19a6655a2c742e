"""Switch-style top-1 MoE layer with expert capacity and the load-balancing auxiliary loss."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOKENS, D, F, E, CAPACITY = 16, 8, 16, 4, 5


def _route(x, w_router):
    probs = jax.nn.softmax(x @ w_router, axis=-1)
    choice = jnp.argmax(probs, axis=-1)
    onehot = jax.nn.one_hot(choice, E, dtype=x.dtype)
    slot = jnp.cumsum(onehot, axis=0) * onehot
    kept = onehot * (slot <= CAPACITY)
    gate = jnp.sum(probs * onehot, axis=-1)
    aux = E * jnp.sum(onehot.mean(0) * probs.mean(0))
    return kept, gate, aux


def switch_layer(x, w_router, w_up, w_down):
    kept, gate, aux = _route(x, w_router)
    y = jnp.zeros_like(x)
    for e in range(E):
        h = jax.nn.relu(x @ w_up[e]) @ w_down[e]
        y = y + kept[:, e:e + 1] * h
    return x + gate[:, None] * y, aux


def switch_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((TOKENS, D), f), jax.ShapeDtypeStruct((D, E), f),
            jax.ShapeDtypeStruct((E, D, F), f), jax.ShapeDtypeStruct((E, F, D), f))


def _expert_shard(x, w_router, w_up, w_down, first_expert):
    kept, gate, aux = _route(x, w_router)
    n_local = w_up.shape[0]
    mine = lax.dynamic_slice_in_dim(kept, first_expert(n_local), n_local, axis=1)
    h = jax.nn.relu(jnp.einsum("td,edf->etf", x, w_up))
    out = jnp.einsum("etf,efd,te->td", h, w_down, mine)
    return x + gate[:, None] * lax.psum(out, "expert"), aux


def switch_layer_ep(x, w_router, w_up, w_down):
    def local(*args):
        return _expert_shard(*args, lambda n: lax.axis_index("expert") * n)

    fn = jax.shard_map(local, in_specs=(P(), P(), P("expert"), P("expert")),
                       out_specs=(P(), P()))
    return fn(x, w_router, w_up, w_down)


def switch_layer_ep_v2(x, w_router, w_up, w_down):
    def local(*args):
        return _expert_shard(*args, lambda n: lax.axis_index("expert"))

    fn = jax.shard_map(local, in_specs=(P(), P(), P("expert"), P("expert")),
                       out_specs=(P(), P()))
    return fn(x, w_router, w_up, w_down)
