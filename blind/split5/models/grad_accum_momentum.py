# Gradient accumulation over microbatches (lax.scan) followed by a heavy-ball momentum update.
# The distributed step splits every microbatch over 'data' and all-reduces each gradient.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

K, MB, D, C = 4, 8, 6, 3
LR, BETA = 0.5, 0.9


def accum_inputs():
    f = jnp.float32
    params = {"w": jax.ShapeDtypeStruct((D, C), f), "b": jax.ShapeDtypeStruct((C,), f)}
    momentum = {"w": jax.ShapeDtypeStruct((D, C), f), "b": jax.ShapeDtypeStruct((C,), f)}
    return params, momentum, jax.ShapeDtypeStruct((K, MB, D), f), jax.ShapeDtypeStruct((K, MB, C), f)


def loss_fn(params, x, y):
    logits = x @ params["w"] + params["b"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.softmax(y), axis=-1))


def train_step(params, momentum, xs, ys):
    def acc(g_sum, batch):
        g = jax.grad(loss_fn)(params, *batch)
        return jax.tree.map(jnp.add, g_sum, g), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    g_sum, _ = lax.scan(acc, zeros, (xs, ys))
    grads = jax.tree.map(lambda g: g / K, g_sum)
    momentum = jax.tree.map(lambda m, g: BETA * m + g, momentum, grads)
    params = jax.tree.map(lambda p, m: p - LR * m, params, momentum)
    return params, momentum


def train_step_dp(params, momentum, xs, ys, mesh):
    def local(params, momentum, xs, ys):
        def acc(g_sum, batch):
            g = lax.pmean(jax.grad(loss_fn)(params, *batch), "data")
            return jax.tree.map(jnp.add, g_sum, g), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        g_sum, _ = lax.scan(acc, zeros, (xs, ys))
        grads = jax.tree.map(lambda g: g / K, g_sum)
        momentum = jax.tree.map(lambda m, g: BETA * m + g, momentum, grads)
        params = jax.tree.map(lambda p, m: p - LR * m, params, momentum)
        return params, momentum

    rep = {"w": P(), "b": P()}
    return jax.shard_map(local, mesh=mesh, in_specs=(rep, rep, P(None, "data"), P(None, "data")),
                         out_specs=(rep, rep), check_vma=False)(params, momentum, xs, ys)


def train_step_dp_unaveraged(params, momentum, xs, ys, mesh):
    def local(params, momentum, xs, ys):
        def acc(g_sum, batch):
            g = lax.pmean(jax.grad(loss_fn)(params, *batch), "data")
            return jax.tree.map(jnp.add, g_sum, g), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, _ = lax.scan(acc, zeros, (xs, ys))
        momentum = jax.tree.map(lambda m, g: BETA * m + g, momentum, grads)
        params = jax.tree.map(lambda p, m: p - LR * m, params, momentum)
        return params, momentum

    rep = {"w": P(), "b": P()}
    return jax.shard_map(local, mesh=mesh, in_specs=(rep, rep, P(None, "data"), P(None, "data")),
                         out_specs=(rep, rep), check_vma=False)(params, momentum, xs, ys)
