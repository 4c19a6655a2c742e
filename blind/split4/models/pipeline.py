"""GPipe-style pipeline parallelism: stage s of the 'stage' axis owns a slice of the layer stack;
activations move stage to stage with ppermute, microbatches stream through a lax.scan."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

MICRO, MB, WIDTH = 4, 2, 8


def stack_inputs(n_layers):
    f = jnp.float32
    return (jax.ShapeDtypeStruct((n_layers, WIDTH, WIDTH), f), jax.ShapeDtypeStruct((n_layers, WIDTH), f),
            jax.ShapeDtypeStruct((MICRO, MB, WIDTH), f))


def four_layers():
    return stack_inputs(4)


def eight_layers():
    return stack_inputs(8)


def dense(h, w, b):
    return jnp.tanh(h @ w + b) + h


def sequential(ws, bs, xs):
    def one_micro(x):
        for i in range(ws.shape[0]):
            x = dense(x, ws[i], bs[i])
        return x

    return jax.vmap(one_micro)(xs)


def gpipe(ws, bs, xs, mesh):
    n = mesh.shape["stage"]

    def stage_fn(w, b, xs):
        me = lax.axis_index("stage")
        fwd = [(i, (i + 1) % n) for i in range(n)]

        def tick(carry, t):
            state, outs = carry
            feed = xs[jnp.clip(t, 0, MICRO - 1)]
            state = jnp.where(me == 0, feed, state)
            state = dense(state, w[0], b[0])
            done = t - (n - 1)
            outs = jnp.where((me == n - 1) & (done >= 0),
                             outs.at[jnp.clip(done, 0, MICRO - 1)].set(state), outs)
            return (lax.ppermute(state, "stage", fwd), outs), None

        init = (jnp.zeros_like(xs[0]), jnp.zeros_like(xs))
        (_, outs), _ = lax.scan(tick, init, jnp.arange(MICRO + n - 1))
        return lax.psum(outs, "stage")

    return jax.shard_map(stage_fn, mesh=mesh, in_specs=(P("stage"), P("stage"), P()),
                         out_specs=P(), check_vma=False)(ws, bs, xs)


def gpipe_backwards_ring(ws, bs, xs, mesh):
    n = mesh.shape["stage"]

    def stage_fn(w, b, xs):
        me = lax.axis_index("stage")
        fwd = [(i, (i - 1) % n) for i in range(n)]

        def tick(carry, t):
            state, outs = carry
            feed = xs[jnp.clip(t, 0, MICRO - 1)]
            state = jnp.where(me == 0, feed, state)
            state = dense(state, w[0], b[0])
            done = t - (n - 1)
            outs = jnp.where((me == n - 1) & (done >= 0),
                             outs.at[jnp.clip(done, 0, MICRO - 1)].set(state), outs)
            return (lax.ppermute(state, "stage", fwd), outs), None

        init = (jnp.zeros_like(xs[0]), jnp.zeros_like(xs))
        (_, outs), _ = lax.scan(tick, init, jnp.arange(MICRO + n - 1))
        return lax.psum(outs, "stage")

    return jax.shard_map(stage_fn, mesh=mesh, in_specs=(P("stage"), P("stage"), P()),
                         out_specs=P(), check_vma=False)(ws, bs, xs)


def _multi_layer_pipeline(ws, bs, xs, mesh, lag):
    """Two consecutive layers per stage, applied with fori_loop; outputs collected `lag` ticks late."""
    n = mesh.shape["stage"]
    perm = [(i, i + 1) for i in range(n - 1)]

    def stage_fn(w, b, xs):
        me = lax.axis_index("stage")
        state = jnp.zeros_like(xs[0])
        outs = jnp.zeros_like(xs)
        for t in range(MICRO + n - 1):
            if t < MICRO:
                state = jnp.where(me == 0, xs[t], state)
            state = lax.fori_loop(0, w.shape[0], lambda i, h: dense(h, w[i], b[i]), state)
            if 0 <= t - lag < MICRO:
                outs = outs.at[t - lag].set(jnp.where(me == n - 1, state, 0.0))
            state = lax.ppermute(state, "stage", perm)
        return lax.psum(outs, "stage")

    return jax.shard_map(stage_fn, mesh=mesh, in_specs=(P("stage"), P("stage"), P()),
                         out_specs=P())(ws, bs, xs)


def unrolled_pipeline(ws, bs, xs, mesh):
    return _multi_layer_pipeline(ws, bs, xs, mesh, lag=mesh.shape["stage"] - 1)


def unrolled_pipeline_lag(ws, bs, xs, mesh):
    return _multi_layer_pipeline(ws, bs, xs, mesh, lag=mesh.shape["stage"])
