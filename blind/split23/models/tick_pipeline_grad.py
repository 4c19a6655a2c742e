"""A 4-stage residual-tanh pipeline (stage s: h <- h + tanh(h @ W[s] / sqrt(D) + b[s])) over M
microbatches, driven by a fori_loop of M + S - 1 ticks inside shard_map on {pp: 4}: stage 0 injects
microbatch t, every stage applies its layer, the last stage records microbatch t - (S - 1), states
move one stage on with ppermute.

`pipeline_pp`: forward outputs, the last stage's buffer psum'd out. `pipeline_grad_pp`: jax.grad of
sum((out - y)^2) through the pipeline w.r.t. the stacked stage weights; the per-stage buffers come out
stacked over pp and the loss reads the last stage's.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

S, M, MB, D = 4, 4, 2, 16


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w": f(S, D, D), "b": f(S, D)}, f(M, MB, D)


def grad_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w": f(S, D, D), "b": f(S, D)}, f(M, MB, D), f(M, MB, D)


def _stage(w, b, h):
    return h + jnp.tanh(h @ w / math.sqrt(D) + b)


def sequential(p, x):
    h = x
    for s in range(S):
        h = _stage(p["w"][s], p["b"][s], h)
    return h


def _ticks(p, x, n_ticks, lag):
    s = lax.axis_index("pp")
    w, b = p["w"][0], p["b"][0]

    def tick(t, carry):
        state, out = carry
        inject = lax.dynamic_index_in_dim(x, jnp.minimum(t, M - 1), keepdims=False)
        h = _stage(w, b, jnp.where(s == 0, inject, state))
        m = t - lag
        record = (s == S - 1) & (m >= 0) & (m < M)
        out = jnp.where(record, lax.dynamic_update_index_in_dim(out, h, jnp.clip(m, 0, M - 1), 0), out)
        state = lax.ppermute(h, "pp", [(i, (i + 1) % S) for i in range(S)])
        return state, out

    _, out = lax.fori_loop(0, n_ticks, tick, (jnp.zeros((MB, D)), jnp.zeros((M, MB, D))))
    return out


def _fwd_run(n_ticks, p, x, mesh):
    return jax.shard_map(lambda p, x: lax.psum(_ticks(p, x, n_ticks, S - 1), "pp"), mesh=mesh,
                         in_specs=({"w": P("pp"), "b": P("pp")}, P()), out_specs=P(), check_vma=False)(p, x)


def pipeline_pp(p, x, mesh):
    return _fwd_run(M + S - 1, p, x, mesh)


def pipeline_pp_one_tick_short(p, x, mesh):
    return _fwd_run(M + S - 2, p, x, mesh)


def sequential_grad(p, x, y):
    return jax.grad(lambda p: jnp.sum((sequential(p, x) - y) ** 2))(p)


def _grad_run(lag, p, x, y, mesh):
    def loss(p):
        outs = jax.shard_map(lambda p, x: _ticks(p, x, M + S - 1, lag), mesh=mesh,
                             in_specs=({"w": P("pp"), "b": P("pp")}, P()), out_specs=P("pp"),
                             check_vma=False)(p, x)
        return jnp.sum((outs[(S - 1) * M:] - y) ** 2)
    return jax.grad(loss)(p)


def pipeline_grad_pp(p, x, y, mesh):
    return _grad_run(S - 1, p, x, y, mesh)


def pipeline_grad_pp_records_late(p, x, y, mesh):
    return _grad_run(S, p, x, y, mesh)
