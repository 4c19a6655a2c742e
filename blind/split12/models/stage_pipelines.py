"""Pipeline-parallel residual MLP stacks over a `stage` mesh axis, two schedules.

1. MaxText-style "vmapped stages": a [stages, microbatch, d] state buffer whose leading dim is
   constrained to the `stage` axis; each tick injects the next microbatch into stage 0, applies every
   stage's layer at once with jax.vmap, records the last stage's output, and shifts the buffer by one
   stage with jnp.roll (sharding by jit and with_sharding_constraint only, no shard_map).
2. GPipe in shard_map with a `lax.while_loop` over ticks: every stage owns two consecutive layers
   (stacked weights sharded on the layer dim, applied by an inner `lax.scan` under jax.checkpoint),
   activations move with `lax.ppermute`, the last stage's outputs are summed out with psum.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N, D, F = 8, 16, 32
MICRO = 4
MB = N // MICRO


def _layer(w, x):
    return x + jnp.tanh(x @ w["w_in"]) @ w["w_out"]


def stack_inputs(layers):
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w_in": f(layers, D, F), "w_out": f(layers, F, D)}, f(N, D)


def four_layer_inputs():
    return stack_inputs(4)


def eight_layer_inputs():
    return stack_inputs(8)


def mlp_stack(w, x):
    return lax.scan(lambda h, wl: (_layer(wl, h), None), x, w)[0]


# ---- 1. vmapped stages, jit sharding only ---------------------------------------------------------

def _out_slot(t, stages):
    return t - (stages - 1)


def _out_slot_late(t, stages):
    return t - stages


def _vmapped_pipeline(w, x, mesh, out_slot):
    stages = w["w_in"].shape[0]
    on_stages = NamedSharding(mesh, P("stage"))
    w = jax.tree.map(lambda a: lax.with_sharding_constraint(a, on_stages), w)
    micro = x.reshape(MICRO, MB, D)

    def tick(carry, t):
        state, outputs = carry
        state = state.at[0].set(micro[jnp.minimum(t, MICRO - 1)])
        state = lax.with_sharding_constraint(state, on_stages)
        out = jax.vmap(_layer)(w, state)
        slot = out_slot(t, stages)
        written = lax.dynamic_update_index_in_dim(outputs, out[-1], jnp.maximum(slot, 0), 0)
        outputs = jnp.where(slot >= 0, written, outputs)
        return (jnp.roll(out, 1, axis=0), outputs), None

    init = (jnp.zeros((stages, MB, D)), jnp.zeros((MICRO, MB, D)))
    (_, outputs), _ = lax.scan(tick, init, jnp.arange(MICRO + stages - 1))
    return outputs.reshape(N, D)


def mlp_stack_vmapped_stages(w, x, mesh):
    return _vmapped_pipeline(w, x, mesh, _out_slot)


def mlp_stack_vmapped_stages_late(w, x, mesh):
    return _vmapped_pipeline(w, x, mesh, _out_slot_late)


# ---- 2. GPipe in shard_map, while_loop schedule ---------------------------------------------------

def _ticks(stages):
    return MICRO + stages - 1


def _ticks_short(stages):
    return MICRO + stages - 2


@jax.checkpoint
def _stage(local_w, h):
    return lax.scan(lambda h, wl: (_layer(wl, h), None), h, local_w)[0]


def _gpipe_local(local_w, x, ticks):
    n, i = lax.axis_size("stage"), lax.axis_index("stage")
    micro = x.reshape(MICRO, MB, D)
    ring = [(j, (j + 1) % n) for j in range(n)]

    def body(carry):
        t, h, outputs = carry
        feed = micro[jnp.clip(t, 0, MICRO - 1)]
        h = jnp.where(i == 0, feed, h)
        y = _stage(local_w, h)
        done = t - (n - 1)
        keep = (i == n - 1) & (done >= 0)
        outputs = jnp.where(keep, outputs.at[jnp.maximum(done, 0)].set(y), outputs)
        return t + 1, lax.ppermute(y, "stage", ring), outputs

    init = (jnp.int32(0), jnp.zeros((MB, D)), jnp.zeros((MICRO, MB, D)))
    _, _, outputs = lax.while_loop(lambda c: c[0] < ticks(n), body, init)
    return lax.psum(outputs, "stage").reshape(N, D)


def _gpipe(w, x, mesh, ticks):
    fn = jax.shard_map(lambda w, x: _gpipe_local(w, x, ticks), mesh=mesh,
                       in_specs=(P("stage"), P()), out_specs=P(), check_vma=False)
    return fn(w, x)


def mlp_stack_gpipe(w, x, mesh):
    return _gpipe(w, x, mesh, _ticks)


def mlp_stack_gpipe_short(w, x, mesh):
    return _gpipe(w, x, mesh, _ticks_short)
