"""Pipeline-parallel residual MLP: 8 layers, 4 stages of 2 consecutive layers.

The schedule is a lax.fori_loop; stage 0 takes a fresh microbatch through lax.cond, each stage
runs its layers with an inner fori_loop, the last stage stores finished microbatches.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_LAYERS, N_STAGES, N_MICRO, MB, D, F = 8, 4, 3, 2, 8, 16


class Layer(NamedTuple):
    w_in: jax.Array
    w_out: jax.Array


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(N_MICRO * MB, D), Layer(f(N_LAYERS, D, F), f(N_LAYERS, F, D))


def residual_mlp(x, layers: Layer):
    for i in range(N_LAYERS):
        x = x + jax.nn.relu(x @ layers.w_in[i]) @ layers.w_out[i]
    return x


class PipelineRunner:
    def __init__(self, mesh, axis="stage"):
        self.mesh, self.axis = mesh, axis

    def out_slot(self, t):
        return t - (N_STAGES - 1)

    def stage(self, x, layers: Layer):
        def one(i, h):
            return h + jax.nn.relu(h @ layers.w_in[i]) @ layers.w_out[i]

        return lax.fori_loop(0, layers.w_in.shape[0], one, x)

    def schedule(self, x, layers: Layer):
        me = lax.axis_index(self.axis)
        micro = x.reshape(N_MICRO, MB, D)
        fwd = [(s, s + 1) for s in range(N_STAGES - 1)]

        def tick(t, state):
            inflight, done = state
            h = lax.cond((me == 0) & (t < N_MICRO),
                         lambda: lax.dynamic_index_in_dim(micro, t % N_MICRO, 0, keepdims=False),
                         lambda: inflight)
            h = self.stage(h, layers)
            slot = self.out_slot(t)
            done = lax.cond((me == N_STAGES - 1) & (slot >= 0),
                            lambda d: lax.dynamic_update_index_in_dim(d, h, slot, 0),
                            lambda d: d, done)
            return lax.ppermute(h, self.axis, fwd), done

        state = (jnp.zeros((MB, D)), jnp.zeros((N_MICRO, MB, D)))
        _, done = lax.fori_loop(0, N_MICRO + N_STAGES - 1, tick, state)
        return lax.psum(done, self.axis).reshape(-1, D)

    def __call__(self, x, layers):
        spec = Layer(P(self.axis), P(self.axis))
        return jax.shard_map(self.schedule, mesh=self.mesh, in_specs=(P(), spec), out_specs=P(),
                             check_vma=False)(x, layers)


class LatePipelineRunner(PipelineRunner):
    def out_slot(self, t):
        return t - N_STAGES


def residual_mlp_pp(x, layers, mesh):
    return PipelineRunner(mesh)(x, layers)


def residual_mlp_pp_late(x, layers, mesh):
    return LatePipelineRunner(mesh)(x, layers)
