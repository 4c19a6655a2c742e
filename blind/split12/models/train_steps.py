"""Training steps: jax.grad through a small classifier / regressor, then an optimizer update.

1. AdamW from a given state: softmax cross-entropy over integer labels, gradients clipped to a global
   norm, decoupled weight decay only on "kernel" leaves (chosen by tree path with
   jax.tree_util.tree_map_with_path). Data parallel on a 2-D mesh {host: 2, chip: 4}: each shard
   differentiates its local mean loss, gradients are averaged over both axes, then clipped.
2. SGD with Nesterov momentum, gradient accumulation: inside shard_map over {data: 4} each shard
   loops over its microbatches with lax.fori_loop summing gradients, divides by the microbatch
   count, and the shards' gradients are summed and divided by the shard count.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, HID, C = 32, 16, 32, 8
LR, B1, B2, EPS, WD, MAX_NORM = 1e-2, 0.9, 0.99, 1e-8, 0.1, 0.5
DP_AXES = ("host", "chip")


def _init_like(shape_fn):
    return {"dense1": {"kernel": shape_fn(D, HID), "bias": shape_fn(HID)},
            "dense2": {"kernel": shape_fn(HID, C), "bias": shape_fn(C)}}


def adamw_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = _init_like(f)
    state = {"mu": _init_like(f), "nu": _init_like(f)}
    return params, state, f(N, D), jax.ShapeDtypeStruct((N,), jnp.int32)


def _logits(params, x):
    h = jax.nn.gelu(x @ params["dense1"]["kernel"] + params["dense1"]["bias"])
    return h @ params["dense2"]["kernel"] + params["dense2"]["bias"]


def xent_loss(params, x, labels):
    logp = jax.nn.log_softmax(_logits(params, x), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def clip_by_global_norm(grads):
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
    scale = jnp.minimum(1.0, MAX_NORM / norm)
    return jax.tree.map(lambda g: g * scale, grads)


def adamw_update(params, state, grads):
    nu_in = jax.tree.map(jnp.abs, state["nu"])           # second moments are non-negative
    mu = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, state["mu"], grads)
    nu = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, nu_in, grads)

    def step(path, p, m, v):
        decay = WD * p if path[-1].key == "kernel" else 0.0
        return p - LR * (m / (jnp.sqrt(v) + EPS) + decay)

    return jax.tree_util.tree_map_with_path(step, params, mu, nu), {"mu": mu, "nu": nu}


def adamw_step(params, state, x, labels):
    loss, grads = jax.value_and_grad(xent_loss)(params, x, labels)
    params, state = adamw_update(params, state, clip_by_global_norm(grads))
    return params, state, loss


def _dp_step(params, state, x, labels):
    loss, grads = jax.value_and_grad(xent_loss)(params, x, labels)
    grads = clip_by_global_norm(lax.pmean(grads, DP_AXES))
    params, state = adamw_update(params, state, grads)
    return params, state, lax.pmean(loss, DP_AXES)


def _dp_step_clip_local(params, state, x, labels):
    loss, grads = jax.value_and_grad(xent_loss)(params, x, labels)
    grads = lax.pmean(clip_by_global_norm(grads), DP_AXES)
    params, state = adamw_update(params, state, grads)
    return params, state, lax.pmean(loss, DP_AXES)


def _run_dp(step, params, state, x, labels, mesh):
    fn = jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), P(DP_AXES), P(DP_AXES)),
                       out_specs=(P(), P(), P()), check_vma=False)
    return fn(params, state, x, labels)


def adamw_step_dp(params, state, x, labels, mesh):
    return _run_dp(_dp_step, params, state, x, labels, mesh)


def adamw_step_dp_clip_local(params, state, x, labels, mesh):
    return _run_dp(_dp_step_clip_local, params, state, x, labels, mesh)


# ---- 2. Nesterov SGD with gradient accumulation ---------------------------------------------------

MOM, MICRO = 0.9, 2


def nesterov_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w_in": f(D, HID), "w_out": f(HID, D)}
    return params, {"w_in": f(D, HID), "w_out": f(HID, D)}, f(N, D), f(N, D)


def _regression_loss(params, x, y):
    h = x - jnp.mean(x, axis=-1, keepdims=True)
    pred = jnp.tanh(h @ params["w_in"]) @ params["w_out"]
    return jnp.mean(jnp.sum(jnp.square(pred - y), axis=-1))


def _nesterov(params, velocity, grads):
    velocity = jax.tree.map(lambda v, g: MOM * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v, g: p - LR * (g + MOM * v), params, velocity, grads)
    return params, velocity


def nesterov_step(params, velocity, x, y):
    loss, grads = jax.value_and_grad(_regression_loss)(params, x, y)
    params, velocity = _nesterov(params, velocity, grads)
    return params, velocity, loss


def _accumulate(params, x, y):
    mb = x.shape[0] // MICRO

    def body(i, carry):
        loss_sum, grad_sum = carry
        xs = lax.dynamic_slice_in_dim(x, i * mb, mb)
        ys = lax.dynamic_slice_in_dim(y, i * mb, mb)
        loss, grads = jax.value_and_grad(_regression_loss)(params, xs, ys)
        return loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)

    zeros = jax.tree.map(jnp.zeros_like, params)
    loss, grads = lax.fori_loop(0, MICRO, body, (jnp.float32(0.0), zeros))
    return loss / MICRO, jax.tree.map(lambda g: g / MICRO, grads)


def _average_shards(tree):
    n = lax.axis_size("data")
    return jax.tree.map(lambda t: lax.psum(t, "data") / n, tree)


def _sum_shards(tree):
    return jax.tree.map(lambda t: lax.psum(t, "data"), tree)


def _accum_local(params, velocity, x, y, reduce_grads):
    loss, grads = _accumulate(params, x, y)
    params, velocity = _nesterov(params, velocity, reduce_grads(grads))
    return params, velocity, _average_shards(loss)


def _run_accum(params, velocity, x, y, mesh, reduce_grads):
    fn = jax.shard_map(lambda *a: _accum_local(*a, reduce_grads=reduce_grads), mesh=mesh,
                       in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P(), P()),
                       check_vma=False)
    return fn(params, velocity, x, y)


def nesterov_step_accum(params, velocity, x, y, mesh):
    return _run_accum(params, velocity, x, y, mesh, _average_shards)


def nesterov_step_accum_summed(params, velocity, x, y, mesh):
    return _run_accum(params, velocity, x, y, mesh, _sum_shards)
