"""Pipeline parallelism over the `stage` axis for a stack of residual tanh layers.

Activations move stage to stage with lax.ppermute inside a lax.scan over clock ticks. GPipe holds
one layer per stage; the circular schedule holds layers s and s + STAGES on stage s and sends each
microbatch around the ring twice.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

STAGES, MICRO, MB, D = 4, 4, 2, 16


def layer(h, w, b):
    return h + jnp.tanh(h @ w + b)


def stack(weights, biases, x):
    def body(h, wb):
        return layer(h, *wb), None
    return lax.scan(body, x, (weights, biases))[0]


def _stack_inputs(n_layers):
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((n_layers, D, D), f32), jax.ShapeDtypeStruct((n_layers, D), f32),
            jax.ShapeDtypeStruct((MICRO * MB, D), f32))


def gpipe_inputs():
    return _stack_inputs(STAGES)


def circular_inputs():
    return _stack_inputs(2 * STAGES)


def _ring(h):
    n = lax.axis_size("stage")
    return lax.ppermute(h, "stage", [(i, (i + 1) % n) for i in range(n)])


def _collect(outputs, h, index, valid):
    updated = lax.dynamic_update_index_in_dim(outputs, h, jnp.clip(index, 0, MICRO - 1), 0)
    return jnp.where(valid, updated, outputs)


def _gpipe(weights, biases, x, mesh, drain_delay):
    micro = x.reshape(MICRO, MB, D)

    def local(w, b, micro):
        stage = lax.axis_index("stage")
        last = lax.axis_size("stage") - 1

        def tick(carry, t):
            h, outputs = carry
            h = jnp.where(stage == 0, micro[jnp.minimum(t, MICRO - 1)], h)
            h = layer(h, w[0], b[0])
            done = t - drain_delay
            outputs = _collect(outputs, h, done, (stage == last) & (done >= 0))
            return (_ring(h), outputs), None

        init = (jnp.zeros((MB, D)), jnp.zeros((MICRO, MB, D)))
        _, outputs = lax.scan(tick, init, jnp.arange(MICRO + STAGES - 1))[0]
        return lax.psum(jnp.where(stage == last, outputs, 0.0), "stage").reshape(MICRO * MB, D)

    return jax.shard_map(local, mesh=mesh, in_specs=(P("stage"), P("stage"), P()),
                         out_specs=P(), check_vma=False)(weights, biases, micro)


def gpipe(weights, biases, x, mesh):
    return _gpipe(weights, biases, x, mesh, drain_delay=STAGES - 1)


def gpipe_v2(weights, biases, x, mesh):
    return _gpipe(weights, biases, x, mesh, drain_delay=STAGES)


def circular(weights, biases, x, mesh):
    repeats = weights.shape[0] // STAGES
    w = weights.reshape(repeats, STAGES, D, D)
    b = biases.reshape(repeats, STAGES, D)
    micro = x.reshape(MICRO, MB, D)

    def local(w, b, micro):
        stage = lax.axis_index("stage")
        last = lax.axis_size("stage") - 1

        def tick(carry, t):
            h, outputs = carry
            h = jnp.where((stage == 0) & (t < MICRO), micro[jnp.minimum(t, MICRO - 1)], h)
            r = jnp.clip((t - stage) // MICRO, 0, repeats - 1)
            h = layer(h, w[r, 0], b[r, 0])
            seen = t - stage
            final = (stage == last) & (seen >= (repeats - 1) * MICRO) & (seen < repeats * MICRO)
            outputs = _collect(outputs, h, seen % MICRO, final)
            return (_ring(h), outputs), None

        init = (jnp.zeros((MB, D)), jnp.zeros((MICRO, MB, D)))
        ticks = jnp.arange(MICRO * repeats + STAGES - 1)
        _, outputs = lax.scan(tick, init, ticks)[0]
        return lax.psum(jnp.where(stage == last, outputs, 0.0), "stage").reshape(MICRO * MB, D)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, "stage"), P(None, "stage"), P()),
                         out_specs=P(), check_vma=False)(w, b, micro)

