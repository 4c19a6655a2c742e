"""GPipe forward over 4 stages (one tanh layer each) with 4 microbatches.

Reference: lax.scan over the stacked layers. Pipeline: lax.scan over M + S - 1 clock ticks whose
carry is a tuple (activation in flight, output buffer); activations move to the next stage with a
ppermute ring; the last stage's buffer is broadcast with a psum at the end.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

STAGES, MICRO, MB, D = 4, 4, 2, 8


def pipe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(MICRO * MB, D), f(STAGES, D, D), f(STAGES, D)


def mlp_stack(x, w, b):
    def layer(h, wb):
        return jnp.tanh(h @ wb[0] + wb[1]), None

    return lax.scan(layer, x, (w, b))[0]


def _gpipe(x, w, b, mesh, shift):
    n = STAGES

    def stage_fn(x, w, b):
        w, b = w[0], b[0]
        stage = lax.axis_index("pp")
        micro = x.reshape(MICRO, MB, D)

        def tick(carry, t):
            inflight, outs = carry
            fresh = lax.dynamic_index_in_dim(micro, jnp.minimum(t, MICRO - 1), 0, keepdims=False)
            inp = jnp.where((stage == 0) & (t < MICRO), fresh, inflight)
            y = jnp.tanh(inp @ w + b)
            slot = t - (n - 1)
            write = (stage == n - 1) & (slot >= 0)
            outs = jnp.where(write, lax.dynamic_update_index_in_dim(outs, y, jnp.maximum(slot, 0), 0), outs)
            return (lax.ppermute(y, "pp", shift), outs), None

        init = (jnp.zeros((MB, D), x.dtype), jnp.zeros((MICRO, MB, D), x.dtype))
        (_, outs), _ = lax.scan(tick, init, jnp.arange(MICRO + n - 1))
        return lax.psum(outs, "pp").reshape(MICRO * MB, D)

    fn = jax.shard_map(stage_fn, mesh=mesh, in_specs=(P(), P("pp"), P("pp")), out_specs=P(),
                       check_vma=False)
    return fn(x, w, b)


def mlp_stack_gpipe(x, w, b, mesh):
    return _gpipe(x, w, b, mesh, [(i, (i + 1) % STAGES) for i in range(STAGES)])


def mlp_stack_gpipe_ring(x, w, b, mesh):
    return _gpipe(x, w, b, mesh, [(i, (i - 1) % STAGES) for i in range(STAGES)])
