"""A stack of 8 residual tanh-MLP layers, h <- h + tanh(h @ w1 + b1) @ w2, run as a pipeline over
`pp` with 4 microbatches.

- `gpipe_dp_pp` on {dp: 2, pp: 4}: each stage owns 2 consecutive layers (stacked params sharded
  P("pp")) and applies them with `lax.fori_loop`; ticks in a Python loop, activations shifted by
  `ppermute`; the last stage stores finished microbatches and the result is read from its copy by
  `all_gather(...)[PP - 1]`; batch over `dp`.
- `circular_pp` on {pp: 4}: interleaved / circular schedule with 2 virtual stages per device
  (device d owns layers d and d + 4, params reshaped [V, PP, ...] and sharded on dim 1); the last
  device's output wraps around to device 0 for the second round.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, F, L = 8, 16, 32, 8
PP, M, V = 4, 4, 2
PER_STAGE = L // PP


def pipe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(L, D, F), "b1": f(L, F), "w2": f(L, F, D)}, f(B, D)


def _layer(w1, b1, w2, h):
    return h + jnp.tanh(h @ w1 + b1) @ w2


def mlp_stack(params, x):
    for i in range(L):
        x = _layer(params["w1"][i], params["b1"][i], params["w2"][i], x)
    return x


# ---- GPipe on (dp, pp) --------------------------------------------------------------------------

def _stage(params, h):
    def body(i, h):
        return _layer(params["w1"][i], params["b1"][i], params["w2"][i], h)
    return lax.fori_loop(0, PER_STAGE, body, h)


def _output_slot(t):
    return t - (PP - 1)


def _output_slot_late(t):
    return t - PP


def _gpipe_local(params, x, output_slot):
    stage = lax.axis_index("pp")
    micro = x.reshape(M, x.shape[0] // M, D)
    state = jnp.zeros_like(micro[0])
    outs = jnp.zeros_like(micro)
    for t in range(M + PP - 1):
        if t < M:
            state = jnp.where(stage == 0, micro[t], state)
        state = _stage(params, state)
        if t >= PP - 1:
            slot = output_slot(t)
            outs = outs.at[slot].set(jnp.where(stage == PP - 1, state, outs[slot]))
        state = lax.ppermute(state, "pp", [(i, (i + 1) % PP) for i in range(PP)])
    return lax.all_gather(outs, "pp")[PP - 1].reshape(x.shape)


def _gpipe(output_slot, params, x, mesh):
    return jax.shard_map(lambda p, x: _gpipe_local(p, x, output_slot), mesh=mesh,
                         in_specs=(P("pp"), P("dp")), out_specs=P("dp"), check_vma=False)(params, x)


def gpipe_dp_pp(params, x, mesh):
    return _gpipe(_output_slot, params, x, mesh)


def gpipe_dp_pp_late_slot(params, x, mesh):
    return _gpipe(_output_slot_late, params, x, mesh)


# ---- circular schedule ------------------------------------------------------------------------------

def _circular_local(params, x, perm):
    d = lax.axis_index("pp")
    micro = x.reshape(M, B // M, D)
    state = jnp.zeros_like(micro[0])
    outs = jnp.zeros_like(micro)
    for t in range(M * V + PP - 1):
        if t < M:
            state = jnp.where(d == 0, micro[t], state)
        rnd = jnp.clip((t - d) // M, 0, V - 1)
        state = _layer(params["w1"][rnd, 0], params["b1"][rnd, 0], params["w2"][rnd, 0], state)
        done = t - (PP - 1) - M * (V - 1)
        if 0 <= done < M:
            outs = outs.at[done].set(jnp.where(d == PP - 1, state, outs[done]))
        state = lax.ppermute(state, "pp", perm)
    return lax.psum(jnp.where(d == PP - 1, outs, 0.0), "pp").reshape(B, D)


def _circular(perm, params, x, mesh):
    virtual = jax.tree.map(lambda a: a.reshape(V, PP, *a.shape[1:]), params)
    return jax.shard_map(lambda p, x: _circular_local(p, x, perm), mesh=mesh,
                         in_specs=(P(None, "pp"), P()), out_specs=P(), check_vma=False)(virtual, x)


def circular_pp(params, x, mesh):
    return _circular([(i, (i + 1) % PP) for i in range(PP)], params, x, mesh)


def circular_pp_no_wraparound(params, x, mesh):
    return _circular([(i, i + 1) for i in range(PP - 1)], params, x, mesh)
