"""GPipe forward schedule over a 'stage' mesh axis: one tanh layer per stage, microbatches fed to
stage 0, activations passed to the next stage with ppermute, a lax.fori_loop over clock ticks."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_STAGES, N_MICRO, MB, WIDTH = 4, 4, 2, 8


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((N_STAGES, WIDTH, WIDTH), f), jax.ShapeDtypeStruct((N_STAGES, WIDTH), f),
            jax.ShapeDtypeStruct((N_MICRO, MB, WIDTH), f))


def layer(w, b, h):
    return jnp.tanh(h @ w + b)


def sequential(weights, biases, microbatches):
    h = microbatches
    for i in range(N_STAGES):
        h = layer(weights[i], biases[i], h)
    return h


def _gpipe(weights, biases, microbatches, mesh, perm):
    def stage_program(w, b, mbs):
        stage = lax.axis_index("stage")
        last = N_STAGES - 1

        def tick(t, carry):
            incoming, outputs = carry
            feed = mbs[jnp.minimum(t, N_MICRO - 1)]
            h = layer(w[0], b[0], jnp.where(stage == 0, feed, incoming))
            done = t - last
            store = (stage == last) & (done >= 0)
            outputs = jnp.where(store, outputs.at[jnp.clip(done, 0, N_MICRO - 1)].set(h), outputs)
            return lax.ppermute(h, "stage", perm), outputs

        init = (jnp.zeros((MB, WIDTH), mbs.dtype), jnp.zeros_like(mbs))
        _, outputs = lax.fori_loop(0, N_MICRO + N_STAGES - 1, tick, init)
        return lax.psum(outputs, "stage")

    return jax.shard_map(stage_program, mesh=mesh, in_specs=(P("stage"), P("stage"), P()),
                         out_specs=P(), check_vma=False)(weights, biases, microbatches)


def gpipe(weights, biases, microbatches, mesh):
    return _gpipe(weights, biases, microbatches, mesh,
                  [(i, (i + 1) % N_STAGES) for i in range(N_STAGES)])


def gpipe_ring(weights, biases, microbatches, mesh):
    return _gpipe(weights, biases, microbatches, mesh,
                  [((i + 1) % N_STAGES, i) for i in range(N_STAGES)])
