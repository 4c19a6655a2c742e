"""Training steps for a two-layer regression MLP: jax.grad, optimizer updates, gradient
accumulation over microbatches, data-parallel gradient averaging."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, O = 16, 8, 16, 4
LR, MOMENTUM, N_MICRO = 0.1, 0.9, 2
B1, B2, WD = 0.9, 0.99, 0.01


def predict(params, x):
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]


def mse(params, x, y):
    return jnp.mean(jnp.square(predict(params, x) - y))


def _params():
    f32 = jnp.float32
    return {"w1": jax.ShapeDtypeStruct((D, F), f32), "b1": jax.ShapeDtypeStruct((F,), f32),
            "w2": jax.ShapeDtypeStruct((F, O), f32)}


def _data():
    return jax.ShapeDtypeStruct((N, D), jnp.float32), jax.ShapeDtypeStruct((N, O), jnp.float32)


def sgd_step(params, velocity, x, y):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    velocity = jax.tree.map(lambda v, g: MOMENTUM * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - LR * v, params, velocity)
    return params, velocity, loss


def sgd_step_inputs():
    return (_params(), _params(), *_data())


def _accumulate(params, x, y):
    """Mean loss and gradient over N_MICRO equal microbatches of this shard."""
    xs = x.reshape(N_MICRO, -1, x.shape[-1])
    ys = y.reshape(N_MICRO, -1, y.shape[-1])

    def micro(acc, batch):
        loss, grads = jax.value_and_grad(mse)(params, *batch)
        return jax.tree.map(jnp.add, acc, (loss, grads)), None

    zero = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
    total, _ = lax.scan(micro, zero, (xs, ys))
    return jax.tree.map(lambda t: t / N_MICRO, total)


def _dp_sgd(params, velocity, x, y, mesh, reduce):
    def local(params, velocity, x, y):
        loss, grads = reduce(_accumulate(params, x, y))
        velocity = jax.tree.map(lambda v, g: MOMENTUM * v + g, velocity, grads)
        params = jax.tree.map(lambda p, v: p - LR * v, params, velocity)
        return params, velocity, loss

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                         out_specs=(P(), P(), P()), check_vma=False)(params, velocity, x, y)


def sgd_step_dp(params, velocity, x, y, mesh):
    return _dp_sgd(params, velocity, x, y, mesh, lambda acc: lax.pmean(acc, "data"))


def sgd_step_dp_v2(params, velocity, x, y, mesh):
    return _dp_sgd(params, velocity, x, y, mesh, lambda acc: lax.psum(acc, "data"))


def _lion(params, momentum, grads):
    """Lion (sign of the interpolated momentum) with decoupled weight decay."""
    update = jax.tree.map(lambda m, g: jnp.sign(B1 * m + (1 - B1) * g), momentum, grads)
    params = jax.tree.map(lambda p, u: p - LR * (u + WD * p), params, update)
    momentum = jax.tree.map(lambda m, g: B2 * m + (1 - B2) * g, momentum, grads)
    return params, momentum


def lion_step(params, momentum, x, y):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    return (*_lion(params, momentum, grads), loss)


def lion_step_inputs():
    return (_params(), _params(), *_data())


_TP = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None)}


def lion_step_dp_tp(params, momentum, x, y, mesh):
    """Megatron TP forward inside a shard_map, differentiated from outside by jax.grad; the
    optimizer runs on the global arrays."""

    def sharded_loss(params, x, y):
        def local(params, x, y):
            partial = jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]
            err = lax.psum(partial, "model") - y
            return lax.pmean(jnp.mean(jnp.square(err)), "data")

        return jax.shard_map(local, mesh=mesh, in_specs=(_TP, P("data"), P("data")),
                             out_specs=P())(params, x, y)

    loss, grads = jax.value_and_grad(sharded_loss)(params, x, y)
    return (*_lion(params, momentum, grads), loss)
