"""One AdEMAMix optimizer step (two momenta: a fast bias-corrected EMA and a slow EMA mixed in with
weight ALPHA_MIX; the second moment stored as its root `r`) with decoupled weight decay, on a
two-layer tanh regressor with a mean-squared loss.

- `ademamix_dp`: shard_map on {dp: 4}; batch over dp, local gradients averaged with pmean, the
  update replicated;
- `ademamix_accum_jit`: gradient accumulation over A microbatches with lax.fori_loop under jit on
  {dp: 2}, every microbatch split over dp by a sharding constraint.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N, DIN, DH, DOUT, A = 16, 8, 16, 4, 4
B1, B2, B3, ALPHA_MIX, LR, EPS, WD, STEP = 0.9, 0.999, 0.9999, 5.0, 1e-2, 1e-8, 0.01, 3


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(DIN, DH), "b1": f(DH), "w2": f(DH, DOUT)}
    state = {k: dict(params) for k in ("m1", "m2", "r")}
    return params, state, f(N, DIN), f(N, DOUT)


def _loss(params, x, y):
    pred = jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]
    return jnp.mean((pred - y) ** 2)


def _update(params, state, grads):
    tm = jax.tree_util.tree_map
    m1 = tm(lambda m, g: B1 * m + (1 - B1) * g, state["m1"], grads)
    m2 = tm(lambda m, g: B3 * m + (1 - B3) * g, state["m2"], grads)
    r = tm(lambda r, g: jnp.sqrt(B2 * r * r + (1 - B2) * g * g), state["r"], grads)

    def step(p, a, b, c):
        u = (a / (1 - B1 ** STEP) + ALPHA_MIX * b) / (c / jnp.sqrt(1 - B2 ** STEP) + EPS)
        return p - LR * (u + WD * p)

    return tm(step, params, m1, m2, r), {"m1": m1, "m2": m2, "r": r}


def train_step(params, state, x, y):
    return _update(params, state, jax.grad(_loss)(params, x, y))


def _dp_local(params, state, x, y, reduce):
    grads = jax.tree_util.tree_map(reduce, jax.grad(_loss)(params, x, y))
    return _update(params, state, grads)


def _dp(params, state, x, y, mesh, reduce):
    return jax.shard_map(lambda *a: _dp_local(*a, reduce), mesh=mesh, in_specs=(P(), P(), P("dp"), P("dp")),
                         out_specs=(P(), P()), check_vma=False)(params, state, x, y)


def ademamix_dp(params, state, x, y, mesh):
    return _dp(params, state, x, y, mesh, lambda g: lax.pmean(g, "dp"))


def ademamix_dp_grads_summed(params, state, x, y, mesh):
    return _dp(params, state, x, y, mesh, lambda g: lax.psum(g, "dp"))


def _accum(params, state, x, y, mesh, loop):
    c = lambda a: lax.with_sharding_constraint(a, NamedSharding(mesh, P(None, "dp")))
    xs, ys = c(x.reshape(A, N // A, DIN)), c(y.reshape(A, N // A, DOUT))

    def body(i, acc):
        g = jax.grad(_loss)(params, xs[i], ys[i])
        return jax.tree_util.tree_map(lambda a, b: a + b / A, acc, g)

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return _update(params, state, loop(body, zeros))


def ademamix_accum_jit(params, state, x, y, mesh):
    return _accum(params, state, x, y, mesh, lambda body, init: lax.fori_loop(0, A, body, init))


def ademamix_accum_jit_first_microbatch_skipped(params, state, x, y, mesh):
    return _accum(params, state, x, y, mesh, lambda body, init: lax.fori_loop(1, A, body, init))
