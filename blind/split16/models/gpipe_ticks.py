"""An 8-layer residual GELU MLP stack ([L, D, F] / [L, F, D] stacked weights) run as a GPipe
forward pass: 4 microbatches stream through the stages, one `ppermute` per clock tick, the last
stage writes microbatch t - (stages - 1) into an output buffer which is psum'd over the stage axis.

- `gpipe_4_stages` on {stage: 4}: 2 layers per stage, scanned with `lax.scan`;
- `gpipe_dp_tp` on the 3-D mesh {data: 2, stage: 2, model: 2}: batch over `data`, 4 layers per
  stage, each MLP column/row split over `model` with a psum.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, L = 16, 16, 32, 8
M = 4


def stack_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(L, D, F), f(L, F, D), f(N, D)


def _layer(x, w, reduce_mlp):
    w1, w2 = w
    return x + reduce_mlp(jax.nn.gelu(x @ w1) @ w2) / 4.0


def _identity(t):
    return t


def run_stack(w1, w2, x, reduce_mlp=_identity):
    y, _ = lax.scan(lambda h, w: (_layer(h, w, reduce_mlp), None), x, (w1, w2))
    return y


def mlp_stack(w1, w2, x):
    return run_stack(w1, w2, x)


def last_stage_slot(t, stages):
    return t - (stages - 1)


def last_stage_slot_late(t, stages):
    return t - stages


def _gpipe_local(w1, w2, x, stages, reduce_mlp, out_slot):
    s = lax.axis_index("stage")
    xs = x.reshape(M, -1, D)
    shift = [(i, (i + 1) % stages) for i in range(stages)]

    def tick(carry, t):
        buf, outs = carry
        inp = jnp.where(s == 0, xs[jnp.minimum(t, M - 1)], buf)
        y = run_stack(w1, w2, inp, reduce_mlp)
        done = (s == stages - 1) & (t >= stages - 1)
        outs = jnp.where(done, outs.at[out_slot(t, stages)].set(y), outs)
        return (lax.ppermute(y, "stage", shift), outs), None

    init = (jnp.zeros_like(xs[0]), jnp.zeros_like(xs))
    (_, outs), _ = lax.scan(tick, init, jnp.arange(M + stages - 1))
    return lax.psum(outs, "stage").reshape(x.shape)


# ---- {stage: 4} --------------------------------------------------------------------------------------

def _four_stages(out_slot, w1, w2, x, mesh):
    local = functools.partial(_gpipe_local, stages=4, reduce_mlp=_identity, out_slot=out_slot)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("stage"), P("stage"), P()), out_specs=P(),
                         check_vma=False)(w1, w2, x)


def gpipe_4_stages(w1, w2, x, mesh):
    return _four_stages(last_stage_slot, w1, w2, x, mesh)


def gpipe_4_stages_late_slot(w1, w2, x, mesh):
    return _four_stages(last_stage_slot_late, w1, w2, x, mesh)


# ---- {data: 2, stage: 2, model: 2} -------------------------------------------------------------------

def _dp_tp(reduce_mlp, w1, w2, x, mesh):
    local = functools.partial(_gpipe_local, stages=2, reduce_mlp=reduce_mlp,
                              out_slot=last_stage_slot)
    return jax.shard_map(local, mesh=mesh,
                         in_specs=(P("stage", None, "model"), P("stage", "model", None),
                                   P("data")),
                         out_specs=P("data"), check_vma=False)(w1, w2, x)


def gpipe_dp_tp(w1, w2, x, mesh):
    return _dp_tp(lambda t: lax.psum(t, "model"), w1, w2, x, mesh)


def gpipe_dp_tp_no_psum(w1, w2, x, mesh):
    return _dp_tp(_identity, w1, w2, x, mesh)
