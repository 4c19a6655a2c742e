"""Pipeline parallelism over a mesh axis with ppermute.

GPipe: one layer per stage, microbatches streamed through a lax.scan schedule.
Circular (interleaved) pipeline: layer r * S + s lives on stage s, microbatches go round the ring R
times in a lax.fori_loop schedule.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, MB = 16, 2


def _layer(w, b, x):
    return jnp.tanh(x @ w + b)


# ---- GPipe over scan: 4 stages x 1 layer, 4 microbatches ----------------------------------------

S_G, M_G = 4, 4


def gpipe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w": f(S_G, D, D), "b": f(S_G, D)}, f(M_G * MB, D)


def mlp_stack(params, x):
    for l in range(params["w"].shape[0]):
        x = _layer(params["w"][l], params["b"][l], x)
    return x


def _gpipe(output_slot):
    def stage_fn(params, x):
        w, b = params["w"][0], params["b"][0]
        stage = lax.axis_index("stage")
        n = lax.axis_size("stage")
        micro = x.reshape(M_G, MB, D)

        def tick(carry, t):
            state, outputs = carry
            with jax.named_scope("gpipe_tick"):
                inp = jnp.where(stage == 0, micro[jnp.minimum(t, M_G - 1)], state)
                y = _layer(w, b, inp)
                j = output_slot(t, n)
                write = (stage == n - 1) & (j >= 0)
                outputs = jnp.where(write, lax.dynamic_update_index_in_dim(outputs, y, j, 0), outputs)
                state = lax.ppermute(y, "stage", [(i, i + 1) for i in range(S_G - 1)])
            return (state, outputs), None

        init = lax.pcast((jnp.zeros((MB, D)), jnp.zeros((M_G, MB, D))), "stage", to="varying")
        (_, outputs), _ = lax.scan(tick, init, jnp.arange(M_G + S_G - 1))
        return lax.psum(outputs, "stage").reshape(M_G * MB, D)
    return stage_fn


def mlp_stack_gpipe(params, x, mesh):
    fn = _gpipe(lambda t, n: t - (n - 1))
    return jax.shard_map(fn, mesh=mesh, in_specs=({"w": P("stage"), "b": P("stage")}, P()),
                         out_specs=P())(params, x)


def mlp_stack_gpipe_slot(params, x, mesh):
    fn = _gpipe(lambda t, n: t - n)
    return jax.shard_map(fn, mesh=mesh, in_specs=({"w": P("stage"), "b": P("stage")}, P()),
                         out_specs=P())(params, x)


# ---- circular pipeline over fori_loop: 4 stages x 2 repeats, 4 microbatches ---------------------

S_C, R_C = 4, 2
M_C = S_C


def circular_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w": f(R_C * S_C, D, D), "b": f(R_C * S_C, D)}, f(M_C * MB, D)


def _circular(ring):
    def stage_fn(w, b, x):
        s = lax.axis_index("pp")
        micro = x.reshape(M_C, MB, D)

        def tick(t, carry):
            state, outputs = carry
            r = jnp.clip((t - s) // S_C, 0, R_C - 1)
            inp = jnp.where((s == 0) & (t < M_C), micro[jnp.minimum(t, M_C - 1)], state)
            y = _layer(w[r, 0], b[r, 0], inp)
            done = (s == S_C - 1) & (t - s >= S_C * (R_C - 1)) & (t - s < S_C * R_C)
            m = (t - s) % S_C
            outputs = jnp.where(done, lax.dynamic_update_index_in_dim(outputs, y, m, 0), outputs)
            return lax.ppermute(y, "pp", ring), outputs

        init = lax.pcast((jnp.zeros((MB, D)), jnp.zeros((M_C, MB, D))), "pp", to="varying")
        _, outputs = lax.fori_loop(0, S_C * R_C + S_C - 1, tick, init)
        return lax.psum(outputs, "pp").reshape(M_C * MB, D)
    return stage_fn


def _circular_call(stage_fn, params, x, mesh):
    w = params["w"].reshape(R_C, S_C, D, D)
    b = params["b"].reshape(R_C, S_C, D)
    return jax.shard_map(stage_fn, mesh=mesh, in_specs=(P(None, "pp"), P(None, "pp"), P()),
                         out_specs=P())(w, b, x)


def mlp_stack_circular(params, x, mesh):
    ring = [(i, (i + 1) % S_C) for i in range(S_C)]
    return _circular_call(_circular(ring), params, x, mesh)


def mlp_stack_circular_no_wrap(params, x, mesh):
    ring = [(i, i + 1) for i in range(S_C - 1)]
    return _circular_call(_circular(ring), params, x, mesh)
