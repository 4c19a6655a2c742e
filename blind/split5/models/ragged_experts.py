# Dropless top-1 MoE over ragged expert groups: tokens sorted by expert, lax.ragged_dot with the
# per-expert group sizes. Expert-parallel version: experts split over 'ep'; each device rolls its
# contiguous token segment to the front, runs ragged_dot with its own groups, rolls back, psum.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOK, D, F, NE = 16, 8, 8, 4


def ragged_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((TOK, D), f), jax.ShapeDtypeStruct((D, NE), f),
            jax.ShapeDtypeStruct((NE, D, F), f), jax.ShapeDtypeStruct((NE, F, D), f))


def _route(x, router):
    logits = x @ router
    expert = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    gate = jax.nn.softmax(logits, axis=-1).max(axis=-1)
    order = jnp.argsort(expert)
    sizes = jnp.bincount(expert, length=NE).astype(jnp.int32)
    return order, sizes, gate


def ragged_moe(x, router, w1, w2):
    order, sizes, gate = _route(x, router)
    xs = x[order]
    h = jax.nn.relu(lax.ragged_dot(xs, w1, sizes))
    ys = lax.ragged_dot(h, w2, sizes)
    return jnp.zeros_like(ys).at[order].set(ys) * gate[:, None]


def ragged_moe_ep(x, router, w1, w2):
    def device(x, router, w1, w2):
        n_local = w1.shape[0]
        first = lax.axis_index("ep") * n_local
        order, sizes, gate = _route(x, router)
        start = jnp.sum(jnp.where(jnp.arange(NE) < first, sizes, 0))
        local_sizes = lax.dynamic_slice_in_dim(sizes, first, n_local)
        xs = jnp.roll(x[order], -start, axis=0)
        h = jax.nn.relu(lax.ragged_dot(xs, w1, local_sizes))
        ys = jnp.roll(lax.ragged_dot(h, w2, local_sizes), start, axis=0)
        ys = lax.psum(ys, "ep")
        return jnp.zeros_like(ys).at[order].set(ys) * gate[:, None]

    return jax.shard_map(device, in_specs=(P(), P(), P("ep"), P("ep")), out_specs=P())(
        x, router, w1, w2)
