"""GPipe forward over four stages on 'stage': one tanh layer per stage, four microbatches.

Activations move to the next stage with ppermute after every step; the last stage records the
finished microbatches and a psum replicates them.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_STAGES, N_MICRO, MB, WIDTH = 4, 4, 2, 8


def pipeline_inputs():
    return (jax.ShapeDtypeStruct((N_STAGES, WIDTH, WIDTH), jnp.float32),
            jax.ShapeDtypeStruct((N_STAGES, WIDTH), jnp.float32),
            jax.ShapeDtypeStruct((N_MICRO, MB, WIDTH), jnp.float32))


def sequential(weights, biases, microbatches):
    h = microbatches
    for layer in range(N_STAGES):
        h = jnp.tanh(h @ weights[layer] + biases[layer])
    return h


def _forward_shift(n):
    return [(i, (i + 1) % n) for i in range(n)]


def gpipe(weights, biases, microbatches):
    def stage(w, b, xs):
        w, b = w[0], b[0]
        me = lax.axis_index("stage")
        state = jnp.zeros_like(xs[0])
        outs = jnp.zeros_like(xs)
        for t in range(N_MICRO + N_STAGES - 1):
            if t < N_MICRO:
                state = jnp.where(me == 0, xs[t], state)
            state = jnp.tanh(state @ w + b)
            done = t - (N_STAGES - 1)
            if done >= 0:
                outs = outs.at[done].set(jnp.where(me == N_STAGES - 1, state, outs[done]))
            state = lax.ppermute(state, "stage", perm=_forward_shift(N_STAGES))
        return lax.psum(outs, "stage")

    return jax.shard_map(stage, in_specs=(P("stage"), P("stage"), P()), out_specs=P(),
                         check_vma=False)(weights, biases, microbatches)


def gpipe_backwards_ring(weights, biases, microbatches):
    def stage(w, b, xs):
        w, b = w[0], b[0]
        me = lax.axis_index("stage")
        state = jnp.zeros_like(xs[0])
        outs = jnp.zeros_like(xs)
        for t in range(N_MICRO + N_STAGES - 1):
            if t < N_MICRO:
                state = jnp.where(me == 0, xs[t], state)
            state = jnp.tanh(state @ w + b)
            done = t - (N_STAGES - 1)
            if done >= 0:
                outs = outs.at[done].set(jnp.where(me == N_STAGES - 1, state, outs[done]))
            state = lax.ppermute(state, "stage", perm=[(i, (i - 1) % N_STAGES) for i in range(N_STAGES)])
        return lax.psum(outs, "stage")

    return jax.shard_map(stage, in_specs=(P("stage"), P("stage"), P()), out_specs=P(),
                         check_vma=False)(weights, biases, microbatches)
