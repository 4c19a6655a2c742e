"""A 4-stage model with different stage kinds (input projection, two residual GELU MLPs, a
LayerNorm + linear head), pipelined GPipe-style over `pp` with `lax.switch(axis_index, stages)`
choosing what a device computes; weights are replicated, only compute is pipelined, activations
move one stage per tick with `ppermute`.

- `pipeline_unrolled`: on {dp: 2, pp: 4}: batch over dp, the tick loop unrolled in Python, the last
  stage writes finished microbatches into an output buffer at static slots;
- `pipeline_scanned`: on {pp: 4}: the ticks are a `lax.scan` over a stream of microbatches padded
  with P - 1 empty ones, stages wrapped in `jax.checkpoint`, and the last stage's per-tick outputs
  from tick P - 1 on are the results.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, M, STAGES = 16, 16, 32, 4, 4


def pipe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w_in": f(D, D), "w1": f(2, D, F), "w2": f(2, F, D), "ln_scale": f(D), "w_head": f(D, D)}
    return params, f(N, D)


def embed(p, h):
    return jnp.tanh(h @ p["w_in"])


def mlp(p, h, i):
    return h + jax.nn.gelu(h @ p["w1"][i]) @ p["w2"][i]


def head(p, h):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return ((h - mu) / jnp.sqrt(var + 1e-5) * p["ln_scale"]) @ p["w_head"]


def model(p, x):
    return head(p, mlp(p, mlp(p, embed(p, x), 0), 1))


STAGE_FNS = [embed, functools.partial(mlp, i=0), functools.partial(mlp, i=1), head]


def _shift(h):
    return lax.ppermute(h, "pp", [(s, s + 1) for s in range(STAGES - 1)])


# ---- unrolled ticks, static output slots -------------------------------------------------------------

def _unrolled_local(p, x, slot_of):
    stage = lax.axis_index("pp")
    mbs = x.reshape(M, -1, D)
    state = jnp.zeros_like(mbs[0])
    buf = jnp.zeros_like(mbs)
    for t in range(M + STAGES - 1):
        inp = jnp.where(stage == 0, mbs[min(t, M - 1)], state)
        out = lax.switch(stage, [functools.partial(fn, p) for fn in STAGE_FNS], inp)
        slot = slot_of(t)
        if 0 <= slot < M:
            buf = jnp.where(stage == STAGES - 1, buf.at[slot].set(out), buf)
        state = _shift(out)
    return buf.reshape(1, -1, D)


def _unrolled(p, x, mesh, slot_of):
    out = jax.shard_map(lambda p_, x_: _unrolled_local(p_, x_, slot_of), mesh=mesh,
                        in_specs=(P(), P("dp")), out_specs=P("pp", "dp"), check_vma=False)(p, x)
    return out[-1]


def pipeline_unrolled(p, x, mesh):
    return _unrolled(p, x, mesh, slot_of=lambda t: t - (STAGES - 1))


def pipeline_unrolled_late_slot(p, x, mesh):
    return _unrolled(p, x, mesh, slot_of=lambda t: t - STAGES)


# ---- scanned ticks, checkpointed stages ---------------------------------------------------------------

def _head_without_norm(p, h):
    return h @ p["w_head"]


def _scanned_local(p, x, stage_fns):
    stage = lax.axis_index("pp")
    mbs = x.reshape(M, -1, D)
    stream = jnp.concatenate([mbs, jnp.zeros((STAGES - 1,) + mbs.shape[1:], mbs.dtype)])
    branches = [jax.checkpoint(functools.partial(fn, p)) for fn in stage_fns]

    def tick(state, mb):
        out = lax.switch(stage, branches, jnp.where(stage == 0, mb, state))
        return _shift(out), out

    _, outs = lax.scan(tick, jnp.zeros_like(mbs[0]), stream)
    return outs[STAGES - 1:].reshape(1, -1, D)


def _scanned(p, x, mesh, stage_fns):
    out = jax.shard_map(lambda p_, x_: _scanned_local(p_, x_, stage_fns), mesh=mesh,
                        in_specs=(P(), P()), out_specs=P("pp"), check_vma=False)(p, x)
    return out[-1]


def pipeline_scanned(p, x, mesh):
    return _scanned(p, x, mesh, STAGE_FNS)


def pipeline_scanned_head_without_norm(p, x, mesh):
    return _scanned(p, x, mesh, STAGE_FNS[:3] + [_head_without_norm])
