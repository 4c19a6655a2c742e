"""Two data-parallel training steps with less common optimizers.

- NovoGrad (layer-wise second moment: one scalar per weight matrix from the squared norm of its
  gradient, weight decay added to the normalised gradient). `novograd_dp` on {dp: 4}: batch over
  dp, gradients averaged with pmean before the norm. State is (params, m, r) with r the root of
  the second moment. Returns ((params, m, r), loss).
- RAdam (variance-rectified Adam at step 10) with gradient accumulation: `radam_accum_dp` on
  {dp: 2}; every device walks its 4 microbatches with `lax.fori_loop`, sums the microbatch
  gradients and the result is averaged over microbatches and dp. Softmax classifier, int labels.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, DI, DH, C = 16, 8, 16, 8
B1, B2, EPS, WD, LR, STEP, KMB = 0.9, 0.999, 1e-8, 0.01, 0.1, 10, 4


def _mlp_pred(p, xb):
    return jnp.tanh(xb @ p["w1"]) @ p["w2"]


# ---- NovoGrad ---------------------------------------------------------------------------------

def novo_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(DI, DH), "w2": f(DH, C)}
    return params, params, {"w1": f(), "w2": f()}, f(N, DI), f(N, C)


def _mse(p, xb, yb):
    return jnp.mean(jnp.square(_mlp_pred(p, xb) - yb))


def _novograd(p, m, r, g, gsq):
    v = B2 * r * r + (1 - B2) * gsq
    m = B1 * m + g / (jnp.sqrt(v) + EPS) + WD * p
    return p - LR * m, m, jnp.sqrt(v)


def _apply(params, m, r, g, gsq):
    out = {k: _novograd(params[k], m[k], r[k], g[k], gsq[k]) for k in params}
    return tuple({k: out[k][i] for k in params} for i in range(3))


def novograd_step(params, m, r, xb, yb):
    loss, g = jax.value_and_grad(_mse)(params, xb, yb)
    gsq = {k: jnp.sum(jnp.square(g[k])) for k in g}
    return _apply(params, m, r, g, gsq), loss


def _novo_local(params, m, r, xb, yb, per_replica_norm):
    loss, g_local = jax.value_and_grad(_mse)(params, xb, yb)
    g = jax.tree_util.tree_map(lambda a: lax.pmean(a, "dp"), g_local)
    if per_replica_norm:
        gsq = {k: lax.pmean(jnp.sum(jnp.square(g_local[k])), "dp") for k in g}
    else:
        gsq = {k: jnp.sum(jnp.square(g[k])) for k in g}
    return _apply(params, m, r, g, gsq), lax.pmean(loss, "dp")


def _run_novo(args, mesh, per_replica_norm):
    local = lambda *a: _novo_local(*a, per_replica_norm)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P(), P(), P(), P("dp"), P("dp")),
                         out_specs=((P(), P(), P()), P()))(*args)


def novograd_dp(params, m, r, xb, yb, mesh):
    return _run_novo((params, m, r, xb, yb), mesh, False)


def novograd_dp_per_replica_norm(params, m, r, xb, yb, mesh):
    return _run_novo((params, m, r, xb, yb), mesh, True)


# ---- RAdam with fori_loop accumulation ----------------------------------------------------------

def radam_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(DI, DH), "w2": f(DH, C)}
    return params, params, params, f(N, DI), jax.ShapeDtypeStruct((N,), jnp.int32)


def _xent(p, xb, labels):
    logp = jax.nn.log_softmax(_mlp_pred(p, xb), -1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], -1))


RHO_INF = 2.0 / (1 - B2) - 1
RHO_T = RHO_INF - 2 * STEP * B2 ** STEP / (1 - B2 ** STEP)
RECT = math.sqrt((RHO_T - 4) * (RHO_T - 2) * RHO_INF / ((RHO_INF - 4) * (RHO_INF - 2) * RHO_T))


def _radam(p, m, s_root, g):
    m = B1 * m + (1 - B1) * g
    v = B2 * s_root * s_root + (1 - B2) * g * g
    mhat = m / (1 - B1 ** STEP)
    vhat = v / (1 - B2 ** STEP)
    return p - LR * RECT * mhat / (jnp.sqrt(vhat) + EPS), m, jnp.sqrt(v)


def _radam_apply(params, m, s_root, g):
    out = jax.tree_util.tree_map(_radam, params, m, s_root, g)
    pick = lambda i: jax.tree_util.tree_map(lambda t: t[i], out, is_leaf=lambda t: isinstance(t, tuple))
    return pick(0), pick(1), pick(2)


def radam_step(params, m, s_root, xb, labels):
    loss, g = jax.value_and_grad(_xent)(params, xb, labels)
    return _radam_apply(params, m, s_root, g), loss


def _microbatch_start(i, mb):
    return i * mb


def _microbatch_start_unscaled(i, mb):
    return i


def _radam_local(params, m, s_root, xb, labels, start):
    mb = xb.shape[0] // KMB

    def body(i, acc):
        gsum, lsum = acc
        x_i = lax.dynamic_slice_in_dim(xb, start(i, mb), mb)
        y_i = lax.dynamic_slice_in_dim(labels, start(i, mb), mb)
        loss, g = jax.value_and_grad(_xent)(params, x_i, y_i)
        return jax.tree_util.tree_map(jnp.add, gsum, g), lsum + loss

    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    gsum, lsum = lax.fori_loop(0, KMB, body, (zero, jnp.float32(0.0)))
    g = jax.tree_util.tree_map(lambda a: lax.pmean(a / KMB, "dp"), gsum)
    return _radam_apply(params, m, s_root, g), lax.pmean(lsum / KMB, "dp")


def _run_radam(args, mesh, start):
    local = lambda *a: _radam_local(*a, start)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P(), P(), P(), P("dp"), P("dp")),
                         out_specs=((P(), P(), P()), P()))(*args)


def radam_accum_dp(params, m, s_root, xb, labels, mesh):
    return _run_radam((params, m, s_root, xb, labels), mesh, _microbatch_start)


def radam_accum_dp_unscaled_offset(params, m, s_root, xb, labels, mesh):
    return _run_radam((params, m, s_root, xb, labels), mesh, _microbatch_start_unscaled)
