"""Data-parallel training step with gradient accumulation: each dp shard scans over 2
microbatches, carrying (grad sum, loss sum), then averages over microbatches and replicas."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

ACCUM, D_IN, D_OUT, LR = 2, 6, 4, 0.1


def batch_shapes():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return (f(D_IN, D_OUT), f(D_OUT)), f(16, D_IN), f(16, D_OUT)


def loss_fn(params, x, y):
    w, b = params
    return jnp.mean(jnp.square(jnp.tanh(x @ w + b) - y))


def sgd_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss


def _replica_step(params, x, y, reduce_grads):
    xs = x.reshape(ACCUM, -1, x.shape[-1])
    ys = y.reshape(ACCUM, -1, y.shape[-1])

    def micro(carry, batch):
        g_sum, l_sum = carry
        loss, g = jax.value_and_grad(loss_fn)(params, *batch)
        return (jax.tree.map(jnp.add, g_sum, g), l_sum + loss), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (g_sum, l_sum), _ = lax.scan(micro, (zeros, jnp.float32(0.0)), (xs, ys))
    grads = jax.tree.map(reduce_grads, g_sum)
    loss = lax.pmean(l_sum / ACCUM, "dp")
    return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss


def _dp(params, x, y, mesh, reduce_grads):
    body = lambda p, x, y: _replica_step(p, x, y, reduce_grads)
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=(P(), P()),
                         check_vma=False)(params, x, y)


def sgd_step_dp(params, x, y, mesh):
    return _dp(params, x, y, mesh, lambda g: lax.pmean(g / ACCUM, "dp"))


def sgd_step_dp_sum(params, x, y, mesh):
    return _dp(params, x, y, mesh, lambda g: lax.psum(g / ACCUM, "dp"))
