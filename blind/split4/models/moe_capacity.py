"""Switch-style top-1 MoE with a per-expert capacity (overflowing tokens are dropped and keep only
the residual). The sharded version dispatches by a stable argsort of the expert ids."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

T, D, F, E = 16, 8, 16, 4
CAPACITY = T // E


def capacity_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((T, D), f), jax.ShapeDtypeStruct((D, E), f),
            jax.ShapeDtypeStruct((E, D, F), f), jax.ShapeDtypeStruct((E, F, D), f))


def route(x, w_gate):
    logits = x @ w_gate
    expert = jnp.argmax(logits, axis=-1)
    gate = jnp.take_along_axis(jax.nn.softmax(logits, -1), expert[:, None], -1)[:, 0]
    return expert, gate


def switch_ffn(x, w_gate, w1, w2):
    expert, gate = route(x, w_gate)
    onehot = jax.nn.one_hot(expert, E, dtype=jnp.int32)
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)
    kept = position < CAPACITY
    every = jnp.einsum("tef,efd->ted", jax.nn.relu(jnp.einsum("td,edf->tef", x, w1)), w2)
    chosen = jnp.take_along_axis(every, expert[:, None, None], axis=1)[:, 0]
    return x + jnp.where(kept[:, None], gate[:, None] * chosen, 0.0)


def _sorted_slots(expert):
    order = jnp.argsort(expert, stable=True)
    sorted_e = expert[order]
    counts = jnp.bincount(expert, length=E)
    starts = jnp.cumsum(counts) - counts
    return order, sorted_e, jnp.arange(T) - starts[sorted_e]


def switch_ffn_ep(x, w_gate, w1, w2, mesh):
    def per_rank(x, w_gate, w1, w2):
        n_local = w1.shape[0]
        expert, gate = route(x, w_gate)
        order, sorted_e, slot = _sorted_slots(expert)
        local_e = sorted_e - lax.axis_index("ep") * n_local
        mine = (slot < CAPACITY) & (local_e >= 0) & (local_e < n_local)
        e_idx = jnp.where(mine, local_e, n_local)
        s_idx = jnp.where(mine, slot, 0)
        buf = jnp.zeros((n_local, CAPACITY, D), x.dtype).at[e_idx, s_idx].set(x[order], mode="drop")
        buf = jnp.einsum("ecf,efd->ecd", jax.nn.relu(jnp.einsum("ecd,edf->ecf", buf, w1)), w2)
        back = buf[jnp.clip(e_idx, 0, n_local - 1), jnp.clip(s_idx, 0, CAPACITY - 1)]
        back = jnp.where(mine[:, None], back, 0.0)
        y = jnp.zeros_like(x).at[order].set(back)
        return x + gate[:, None] * lax.psum(y, "ep")

    return jax.shard_map(per_rank, mesh=mesh, in_specs=(P(), P(), P("ep"), P("ep")),
                         out_specs=P())(x, w_gate, w1, w2)


def switch_ffn_ep_capacity_slip(x, w_gate, w1, w2, mesh):
    def per_rank(x, w_gate, w1, w2):
        n_local = w1.shape[0]
        expert, gate = route(x, w_gate)
        order, sorted_e, slot = _sorted_slots(expert)
        local_e = sorted_e - lax.axis_index("ep") * n_local
        mine = (slot <= CAPACITY) & (local_e >= 0) & (local_e < n_local)
        e_idx = jnp.where(mine, local_e, n_local)
        s_idx = jnp.where(mine, slot, 0)
        buf = jnp.zeros((n_local, CAPACITY, D), x.dtype).at[e_idx, s_idx].set(x[order], mode="drop")
        buf = jnp.einsum("ecf,efd->ecd", jax.nn.relu(jnp.einsum("ecd,edf->ecf", buf, w1)), w2)
        back = buf[jnp.clip(e_idx, 0, n_local - 1), jnp.clip(s_idx, 0, CAPACITY - 1)]
        back = jnp.where(mine[:, None], back, 0.0)
        y = jnp.zeros_like(x).at[order].set(back)
        return x + gate[:, None] * lax.psum(y, "ep")

    return jax.shard_map(per_rank, mesh=mesh, in_specs=(P(), P(), P("ep"), P("ep")),
                         out_specs=P())(x, w_gate, w1, w2)
