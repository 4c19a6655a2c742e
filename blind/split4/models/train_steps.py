"""Training steps: forward + backward + optimizer update, data-parallel and fully sharded."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

GLOBAL_BATCH, IN, HIDDEN, OUT = 8, 8, 16, 4


def sgd_inputs():
    f = jnp.float32
    params = {"l1": {"kernel": jax.ShapeDtypeStruct((IN, HIDDEN), f), "bias": jax.ShapeDtypeStruct((HIDDEN,), f)},
              "l2": {"kernel": jax.ShapeDtypeStruct((HIDDEN, OUT), f), "bias": jax.ShapeDtypeStruct((OUT,), f)}}
    return params, jax.ShapeDtypeStruct((GLOBAL_BATCH, IN), f), jax.ShapeDtypeStruct((GLOBAL_BATCH, OUT), f)


def forward(params, x):
    h = jax.nn.relu(x @ params["l1"]["kernel"] + params["l1"]["bias"])
    return h @ params["l2"]["kernel"] + params["l2"]["bias"]


def mse(params, x, y):
    return jnp.mean(jnp.sum((forward(params, x) - y) ** 2, axis=-1))


def sgd_step(params, x, y, lr=0.1):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


def sgd_step_dp(params, x, y, mesh, lr=0.1):
    def replica(params, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        grads = lax.pmean(grads, axis_name="batch")
        loss = lax.pmean(loss, axis_name="batch")
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

    return jax.shard_map(replica, mesh=mesh, in_specs=(P(), P("batch"), P("batch")),
                         out_specs=(P(), P()), check_vma=False)(params, x, y)


def sgd_step_dp_summed(params, x, y, mesh, lr=0.1):
    def replica(params, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        grads = lax.psum(grads, axis_name="batch")
        loss = lax.pmean(loss, axis_name="batch")
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

    return jax.shard_map(replica, mesh=mesh, in_specs=(P(), P("batch"), P("batch")),
                         out_specs=(P(), P()), check_vma=False)(params, x, y)


# ---- FSDP + Adam: weights and optimizer moments sharded along their first dim ------------------
B1, B2, EPS_ADAM, LR_ADAM = 0.9, 0.999, 1e-8, 1e-3


def adam_inputs():
    f = jnp.float32
    w = jax.ShapeDtypeStruct((IN, HIDDEN), f)
    v = jax.ShapeDtypeStruct((HIDDEN, OUT), f)
    return ((w, v), (w, v), (w, v), jax.ShapeDtypeStruct((), jnp.int32),
            jax.ShapeDtypeStruct((GLOBAL_BATCH, IN), f), jax.ShapeDtypeStruct((GLOBAL_BATCH, OUT), f))


def _net_loss(w, v, x, y):
    return jnp.mean((jnp.tanh(x @ w) @ v - y) ** 2)


def _adam(p, g, m, s, t):
    m = B1 * m + (1 - B1) * g
    s = B2 * s + (1 - B2) * g * g
    tt = (t + 1).astype(jnp.float32)
    upd = (m / (1 - B1 ** tt)) / (jnp.sqrt(s / (1 - B2 ** tt)) + EPS_ADAM)
    return p - LR_ADAM * upd, m, s


def adam_step(params, mom, var, t, x, y):
    grads = jax.grad(_net_loss, argnums=(0, 1))(*params, x, y)
    out = [_adam(p, g, m, s, t) for p, g, m, s in zip(params, grads, mom, var)]
    return tuple(tuple(o[i] for o in out) for i in range(3))


def adam_step_fsdp(params, mom, var, t, x, y, mesh):
    n = mesh.shape["fsdp"]

    def device(params, mom, var, t, x, y):
        def local_loss(w_shard, v_shard):
            w = lax.all_gather(w_shard, "fsdp", axis=0, tiled=True)
            v = lax.all_gather(v_shard, "fsdp", axis=0, tiled=True)
            return _net_loss(w, v, x, y)

        # the all_gather transposes to a reduce-scatter: grads arrive summed over devices
        grads = jax.grad(local_loss, argnums=(0, 1))(*params)
        grads = jax.tree.map(lambda g: g / n, grads)
        out = [_adam(p, g, m, s, t) for p, g, m, s in zip(params, grads, mom, var)]
        return tuple(tuple(o[i] for o in out) for i in range(3))

    sharded = (P("fsdp"), P("fsdp"))
    return jax.shard_map(device, mesh=mesh,
                         in_specs=(sharded, sharded, sharded, P(), P("fsdp"), P("fsdp")),
                         out_specs=(sharded, sharded, sharded))(params, mom, var, t, x, y)


# ---- gradient accumulation over microbatches, momentum SGD, 2-way data parallel ------------------
ACCUM = 4


def accum_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((IN, OUT), f), jax.ShapeDtypeStruct((IN, OUT), f),
            jax.ShapeDtypeStruct((ACCUM, GLOBAL_BATCH, IN), f),
            jax.ShapeDtypeStruct((ACCUM, GLOBAL_BATCH, OUT), f))


def _lin_loss(w, x, y):
    return jnp.mean(jnp.abs(jnp.sin(x @ w) - y) ** 1.5)


def accum_step(w, buf, xs, ys, lr=0.05, mu=0.9):
    g = jnp.zeros_like(w)
    loss = 0.0
    for i in range(ACCUM):
        l_i, g_i = jax.value_and_grad(_lin_loss)(w, xs[i], ys[i])
        g, loss = g + g_i, loss + l_i
    g, loss = g / ACCUM, loss / ACCUM
    buf = mu * buf + g
    return w - lr * buf, buf, loss


def _accum_dp(w, buf, xs, ys, mesh, lr=0.05, mu=0.9, normalize=True):
    def device(w, buf, xs, ys):
        def micro(carry, xy):
            g, loss = carry
            l_i, g_i = jax.value_and_grad(_lin_loss)(w, *xy)
            return (g + g_i, loss + l_i), None

        (g, loss), _ = lax.scan(micro, (jnp.zeros_like(w), 0.0), (xs, ys))
        if normalize:
            g, loss = g / xs.shape[0], loss / xs.shape[0]
        g, loss = lax.pmean(g, "dp"), lax.pmean(loss, "dp")
        new_buf = mu * buf + g
        return w - lr * new_buf, new_buf, loss

    return jax.shard_map(device, mesh=mesh, in_specs=(P(), P(), P(None, "dp"), P(None, "dp")),
                         out_specs=(P(), P(), P()), check_vma=False)(w, buf, xs, ys)


def accum_step_dp(w, buf, xs, ys, mesh):
    return _accum_dp(w, buf, xs, ys, mesh)


def accum_step_dp_unnormalized(w, buf, xs, ys, mesh):
    return _accum_dp(w, buf, xs, ys, mesh, normalize=False)
