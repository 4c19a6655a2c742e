"""Switch-Transformer layer (top-1, expert capacity, load-balancing aux loss) in GShard style:
tokens are split into groups, routing and capacity are per group, and experts see [E, G, C, D].

The expert-parallel version puts one group and one expert per device and exchanges dispatched
tokens with all_to_all; the router is a small class of its own.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

GROUPS, GROUP_SIZE, D, E, F, CAPACITY = 4, 8, 8, 4, 16, 3


def abstract():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(GROUPS * GROUP_SIZE, D), {"router": f(D, E), "w1": f(E, D, F), "w2": f(E, F, D)}


def _route_group(xg, router):
    probs = jax.nn.softmax(xg @ router, axis=-1)  # [S, E]
    choice = jnp.argmax(probs, axis=-1)
    onehot = jax.nn.one_hot(choice, E, dtype=jnp.int32)
    slot = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)  # queue position
    kept = (slot < CAPACITY)[:, None] * onehot
    dispatch = kept[:, :, None] * jax.nn.one_hot(slot, CAPACITY)[:, None, :]  # [S, E, C]
    gate = jnp.max(probs, axis=-1)
    frac = jnp.mean(onehot.astype(jnp.float32), axis=0)
    aux = E * jnp.sum(frac * jnp.mean(probs, axis=0))
    return dispatch, dispatch * gate[:, None, None], aux


def switch_layer(x, p):
    xg = x.reshape(GROUPS, GROUP_SIZE, D)
    dispatch, combine, aux = jax.vmap(_route_group, in_axes=(0, None))(xg, p["router"])
    expert_in = jnp.einsum("gsec,gsd->egcd", dispatch, xg)
    h = jax.nn.gelu(jnp.einsum("egcd,edf->egcf", expert_in, p["w1"]))
    expert_out = jnp.einsum("egcf,efd->egcd", h, p["w2"])
    y = jnp.einsum("gsec,egcd->gsd", combine, expert_out)
    return y.reshape(-1, D), jnp.mean(aux)


class Top1Router:
    def __init__(self, n_experts, capacity):
        self.n_experts, self.capacity = n_experts, capacity

    def positions(self, mask):
        """Index of each token in its expert's buffer."""
        return jnp.cumsum(mask, axis=0) - mask

    def __call__(self, x, w):
        logits = x @ w
        probs = jax.nn.softmax(logits, axis=-1)
        idx = jnp.argmax(logits, axis=-1)
        mask = (idx[:, None] == jnp.arange(self.n_experts)[None, :]).astype(jnp.int32)
        pos = jnp.sum(self.positions(mask) * mask, axis=-1)
        mask = mask * (pos < self.capacity)[:, None]
        slots = (pos[:, None] == jnp.arange(self.capacity)[None, :]).astype(x.dtype)
        dispatch = mask[:, :, None].astype(x.dtype) * slots[:, None, :]
        gate = jnp.take_along_axis(probs, idx[:, None], axis=-1)
        density = jnp.mean((idx[:, None] == jnp.arange(self.n_experts)).astype(x.dtype), axis=0)
        aux = self.n_experts * jnp.dot(density, jnp.mean(probs, axis=0))
        return dispatch, dispatch * gate[:, :, None], aux


class Top1RouterScan(Top1Router):
    def positions(self, mask):
        return jax.lax.cumsum(mask, axis=0)


def _ep_layer(x, p, mesh, router):
    def body(x_g, w_router, w1, w2):
        dispatch, combine, aux = router(x_g, w_router)
        buf = jnp.einsum("sec,sd->ecd", dispatch, x_g)
        buf = jax.lax.all_to_all(buf, "ep", split_axis=0, concat_axis=1, tiled=True)  # [1, G*C, D]
        buf = jnp.einsum("ecf,efd->ecd", jax.nn.gelu(jnp.einsum("ecd,edf->ecf", buf, w1)), w2)
        buf = jax.lax.all_to_all(buf, "ep", split_axis=1, concat_axis=0, tiled=True)  # [E, C, D]
        return jnp.einsum("sec,ecd->sd", combine, buf), jax.lax.pmean(aux, "ep")

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P(), P("ep"), P("ep")),
                       out_specs=(P("ep"), P()))
    return fn(x, p["router"], p["w1"], p["w2"])


def switch_layer_ep(x, p, mesh):
    return _ep_layer(x, p, mesh, Top1Router(E, CAPACITY))


def switch_layer_ep_inclusive(x, p, mesh):
    return _ep_layer(x, p, mesh, Top1RouterScan(E, CAPACITY))
