"""GPipe-style pipeline parallelism: one stage per device along 'stage', microbatches enter at
stage 0 and activations move to the next stage with ppermute after every tick."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_STAGES, N_MICRO, MICRO, WIDTH = 4, 6, 2, 8


def stage_fn(h, w, b):
    return jnp.tanh(h @ w + b)


def sequential(xs, weights, biases):
    """xs: [micro, mb, width]; weights: [stages, width, width]; biases: [stages, width]."""
    h = xs
    for s in range(N_STAGES):
        h = stage_fn(h, weights[s], biases[s])
    return h


def gpipe_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((N_MICRO, MICRO, WIDTH), f32),
        jax.ShapeDtypeStruct((N_STAGES, WIDTH, WIDTH), f32),
        jax.ShapeDtypeStruct((N_STAGES, WIDTH), f32),
    )


def gpipe(xs, weights, biases, mesh):
    def device(x_all, w, b):
        w, b = w[0], b[0]
        me = lax.axis_index("stage")
        last = N_STAGES - 1
        shift = [(i, (i + 1) % N_STAGES) for i in range(N_STAGES)]

        def tick(carry, t):
            state, outputs = carry
            fresh = x_all[jnp.minimum(t, N_MICRO - 1)]
            state = jnp.where(me == 0, fresh, state)
            state = stage_fn(state, w, b)
            done = t - last
            write = (me == last) & (done >= 0)
            slot = jnp.clip(done, 0, N_MICRO - 1)
            outputs = outputs.at[slot].set(jnp.where(write, state, outputs[slot]))
            state = lax.ppermute(state, "stage", shift)
            return (state, outputs), None

        init = (jnp.zeros((MICRO, WIDTH), x_all.dtype), jnp.zeros_like(x_all))
        (_, outputs), _ = lax.scan(tick, init, jnp.arange(N_MICRO + N_STAGES - 1))
        return lax.psum(outputs, "stage")

    return jax.shard_map(device, mesh=mesh, in_specs=(P(), P("stage"), P("stage")), out_specs=P(), check_vma=False)(
        xs, weights, biases
    )


def gpipe_reverse_ring(xs, weights, biases, mesh):
    def device(x_all, w, b):
        w, b = w[0], b[0]
        me = lax.axis_index("stage")
        last = N_STAGES - 1
        shift = [((i + 1) % N_STAGES, i) for i in range(N_STAGES)]

        def tick(carry, t):
            state, outputs = carry
            fresh = x_all[jnp.minimum(t, N_MICRO - 1)]
            state = jnp.where(me == 0, fresh, state)
            state = stage_fn(state, w, b)
            done = t - last
            write = (me == last) & (done >= 0)
            slot = jnp.clip(done, 0, N_MICRO - 1)
            outputs = outputs.at[slot].set(jnp.where(write, state, outputs[slot]))
            state = lax.ppermute(state, "stage", shift)
            return (state, outputs), None

        init = (jnp.zeros((MICRO, WIDTH), x_all.dtype), jnp.zeros_like(x_all))
        (_, outputs), _ = lax.scan(tick, init, jnp.arange(N_MICRO + N_STAGES - 1))
        return lax.psum(outputs, "stage")

    return jax.shard_map(device, mesh=mesh, in_specs=(P(), P("stage"), P("stage")), out_specs=P(), check_vma=False)(
        xs, weights, biases
    )
