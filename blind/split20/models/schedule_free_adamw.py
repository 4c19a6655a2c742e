"""One schedule-free AdamW step (Defazio et al. 2024) on a two-layer GELU regressor with a Huber
loss. State (x, z, nu_root): the gradient is taken at y = (1 - b1) z + b1 x, the second moment is
kept as its square root, z takes the AdamW-normalised step with decoupled weight decay at y, and x
is the running average x <- (1 - c) x + c z. Returns ((x, z, nu_root), loss).

- `step_dp`: shard_map on {dp: 4}, batch split, loss and gradients pmean'd over dp;
- `step_jit_accum`: jit-partitioned on {dp: 2, tp: 2}, the batch cut into two microbatches whose
  gradients are accumulated in a `lax.fori_loop`, hidden columns of w1 over tp by sharding
  constraints.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

N, D, F = 16, 8, 16
LR, B1, B2, WD, EPS, STEP = 0.5, 0.9, 0.999, 0.01, 1e-8, 1000


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D, F), "w2": f(F, 1)}
    return params, params, params, f(N, D), f(N, 1)


def huber_loss(params, xb, yb):
    pred = jax.nn.gelu(xb @ params["w1"]) @ params["w2"]
    r = jnp.abs(pred - yb)
    return jnp.mean(jnp.where(r < 1.0, 0.5 * r * r, r - 0.5))


def _y(x, z):
    return jax.tree_util.tree_map(lambda xi, zi: (1 - B1) * zi + B1 * xi, x, z)


def _update(x, z, nu_root, y, g):
    c = 1.0 / (STEP + 1)

    def leaf(xi, zi, ni, yi, gi):
        v = B2 * ni * ni + (1 - B2) * gi * gi
        vhat = v / (1 - B2 ** STEP)
        zi = zi - LR * (gi / (jnp.sqrt(vhat) + EPS) + WD * yi)
        return (1 - c) * xi + c * zi, zi, jnp.sqrt(v)

    out = jax.tree_util.tree_map(leaf, x, z, nu_root, y, g)
    first = lambda i: jax.tree_util.tree_map(lambda t: t[i], out, is_leaf=lambda t: isinstance(t, tuple))
    return first(0), first(1), first(2)


def step(x, z, nu_root, xb, yb):
    y = _y(x, z)
    loss, g = jax.value_and_grad(huber_loss)(y, xb, yb)
    return _update(x, z, nu_root, y, g), loss


# ---- data parallel shard_map ---------------------------------------------------------------------

def _dp_local(x, z, nu_root, xb, yb, reduce_grads):
    y = _y(x, z)
    loss, g = jax.value_and_grad(huber_loss)(y, xb, yb)
    g = jax.tree_util.tree_map(reduce_grads, g)
    return _update(x, z, nu_root, y, g), lax.pmean(loss, "dp")


def _run_dp(x, z, nu_root, xb, yb, mesh, reduce_grads):
    local = lambda *a: _dp_local(*a, reduce_grads)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), P("dp"), P("dp")),
                         out_specs=((P(), P(), P()), P()), check_vma=False)(x, z, nu_root, xb, yb)


def step_dp(x, z, nu_root, xb, yb, mesh):
    return _run_dp(x, z, nu_root, xb, yb, mesh, lambda g: lax.pmean(g, "dp"))


def step_dp_grads_summed(x, z, nu_root, xb, yb, mesh):
    return _run_dp(x, z, nu_root, xb, yb, mesh, lambda g: lax.psum(g, "dp"))


# ---- jit with fori_loop gradient accumulation ---------------------------------------------------

MICRO = 2


def _accum_step(x, z, nu_root, xb, yb, mesh, start):
    c = lambda a, *spec: lax.with_sharding_constraint(a, NamedSharding(mesh, P(*spec)))
    xb, yb = c(xb, "dp"), c(yb, "dp")
    y = _y(x, z)
    y = {"w1": c(y["w1"], None, "tp"), "w2": c(y["w2"], "tp")}
    mb = N // MICRO

    def body(i, carry):
        loss, g = carry
        xs = lax.dynamic_slice_in_dim(xb, start(i, mb), mb)
        ys = lax.dynamic_slice_in_dim(yb, start(i, mb), mb)
        l_i, g_i = jax.value_and_grad(huber_loss)(y, xs, ys)
        return loss + l_i / MICRO, jax.tree_util.tree_map(lambda a, b: a + b / MICRO, g, g_i)

    zero = (jnp.zeros(()), jax.tree_util.tree_map(jnp.zeros_like, y))
    loss, g = lax.fori_loop(0, MICRO, body, zero)
    return _update(x, z, nu_root, y, g), loss


def step_jit_accum(x, z, nu_root, xb, yb, mesh):
    return _accum_step(x, z, nu_root, xb, yb, mesh, lambda i, mb: i * mb)


def step_jit_accum_microbatch_offset(x, z, nu_root, xb, yb, mesh):
    return _accum_step(x, z, nu_root, xb, yb, mesh, lambda i, mb: (i + 1) * mb)
