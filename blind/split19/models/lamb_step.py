"""One LAMB training step (layer-wise trust ratio ||w|| / ||update|| over Adam's bias-corrected
moments with decoupled weight decay) on a two-layer GELU regressor, parameters and optimizer state
as pytrees handled with `jax.tree_util`; the step count is fixed (step 3).

- `lamb_dp_accum`: on {dp: 4}, the batch split over dp; each device accumulates the gradient of
  two local microbatches with `lax.fori_loop`, then `pmean` over dp; update replicated;
- `lamb_2d_dp`: on {replica: 2, data: 2}, the batch split over both axes, gradients averaged with
  `pmean` over ('replica', 'data').
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, DIN, HID, DOUT = 32, 16, 32, 8
LR, B1, B2, EPS, WD, STEP = 1e-2, 0.9, 0.999, 1e-6, 0.01, 3
tree_map = jax.tree_util.tree_map


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(DIN, HID), "w2": f(HID, DOUT)}
    return params, params, params, f(N, DIN), f(N, DOUT)


def loss(params, x, y):
    pred = jax.nn.gelu(x @ params["w1"]) @ params["w2"]
    return jnp.mean(jnp.square(pred - y))


def _lamb(params, m, v, grads):
    m = tree_map(lambda m, g: B1 * m + (1 - B1) * g, m, grads)
    v = tree_map(lambda v, g: B2 * v + (1 - B2) * g * g, v, grads)

    def update(w, m, v):
        u = (m / (1 - B1 ** STEP)) / (jnp.sqrt(v / (1 - B2 ** STEP)) + EPS) + WD * w
        ratio = jnp.linalg.norm(w) / jnp.linalg.norm(u)
        return w - LR * ratio * u

    return tree_map(update, params, m, v), m, v


def train_step(params, m, v, x, y):
    return _lamb(params, m, v, jax.grad(loss)(params, x, y))


# ---- data parallel with gradient accumulation ---------------------------------------------------

def _micro_start(i, mb):
    return i * mb


def _micro_start_unscaled(i, mb):
    return i


def _accum_local(params, m, v, x, y, start):
    mb = x.shape[0] // 2

    def body(i, acc):
        xs = lax.dynamic_slice_in_dim(x, start(i, mb), mb)
        ys = lax.dynamic_slice_in_dim(y, start(i, mb), mb)
        return tree_map(jnp.add, acc, jax.grad(loss)(params, xs, ys))

    g = lax.fori_loop(0, 2, body, tree_map(jnp.zeros_like, params))
    g = tree_map(lambda t: lax.pmean(t / 2, "dp"), g)
    return _lamb(params, m, v, g)


def _dp(args, mesh, start):
    rep = {"w1": P(), "w2": P()}
    return jax.shard_map(lambda *a: _accum_local(*a, start), mesh=mesh,
                         in_specs=(rep, rep, rep, P("dp"), P("dp")), out_specs=(rep, rep, rep),
                         check_vma=False)(*args)


def lamb_dp_accum(params, m, v, x, y, mesh):
    return _dp((params, m, v, x, y), mesh, _micro_start)


def lamb_dp_accum_overlapping_microbatches(params, m, v, x, y, mesh):
    return _dp((params, m, v, x, y), mesh, _micro_start_unscaled)


# ---- two data axes ------------------------------------------------------------------------------

def _2d_local(params, m, v, x, y, axes):
    g = tree_map(lambda t: lax.pmean(t, axes), jax.grad(loss)(params, x, y))
    return _lamb(params, m, v, g)


def _2d(args, mesh, axes):
    rep = {"w1": P(), "w2": P()}
    batch = P(("replica", "data"))
    return jax.shard_map(lambda *a: _2d_local(*a, axes), mesh=mesh,
                         in_specs=(rep, rep, rep, batch, batch), out_specs=(rep, rep, rep),
                         check_vma=False)(*args)


def lamb_2d_dp(params, m, v, x, y, mesh):
    return _2d((params, m, v, x, y), mesh, ("replica", "data"))


def lamb_2d_dp_mean_over_data_only(params, m, v, x, y, mesh):
    return _2d((params, m, v, x, y), mesh, "data")
