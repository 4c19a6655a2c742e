"""One training step of a per-token regressor (x [B, S, D] -> tanh MLP -> one value per token) whose
loss is the masked token mean: sum(mask * err^2) / sum(mask) over the WHOLE batch; SGD with
heavy-ball momentum (m <- MU * m + g; w <- w - LR * m). Returns (params, momentum, loss).

`accum_dp` on {data: 4}: each device holds 2 sequences and runs them as 2 microbatches of one
sequence with `lax.scan`, accumulating the gradient of the masked SUM of squared errors, the sum
itself and the token count; the three are psum-reduced over data and the gradient divided by the
global token count (correct token weighting whatever the padding per microbatch).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, F = 8, 8, 8, 16
LR, MU = 0.05, 0.9
N_DATA, N_MICRO = 4, 2


def accum_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D, F), "w2": f(F)}
    return params, jax.tree_util.tree_map(lambda a: a, params), f(B, S, D), f(B, S), \
        jax.ShapeDtypeStruct((B, S), jnp.bool_)


def _sq_err(params, x, y):
    return (jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2


def masked_mean_loss(params, x, y, mask):
    return jnp.sum(jnp.where(mask, _sq_err(params, x, y), 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def _sgd(params, momentum, g):
    momentum = jax.tree_util.tree_map(lambda m, gi: MU * m + gi, momentum, g)
    return jax.tree_util.tree_map(lambda w, m: w - LR * m, params, momentum), momentum


def train_step(params, momentum, x, y, mask):
    loss, g = jax.value_and_grad(masked_mean_loss)(params, x, y, mask)
    params, momentum = _sgd(params, momentum, g)
    return params, momentum, loss


def _masked_sum(params, x, y, mask):
    return jnp.sum(jnp.where(mask, _sq_err(params, x, y), 0.0))


def accum_dp(params, momentum, x, y, mask, mesh):
    def local(params, momentum, x, y, mask):
        micro = jax.tree_util.tree_map(lambda a: a.reshape(N_MICRO, -1, *a.shape[1:]), (x, y, mask))

        def body(acc, batch):
            g_acc, l_acc, n_acc = acc
            l, g = jax.value_and_grad(_masked_sum)(params, *batch)
            g_acc = jax.tree_util.tree_map(jnp.add, g_acc, g)
            return (g_acc, l_acc + l, n_acc + jnp.sum(batch[2])), None

        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        (g, l, n), _ = lax.scan(body, (zeros, 0.0, 0), micro)
        g, l, n = lax.psum((g, l, n), "data")
        n = jnp.maximum(n, 1)
        g = jax.tree_util.tree_map(lambda gi: gi / n, g)
        params, momentum = _sgd(params, momentum, g)
        return params, momentum, l / n
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data"), P("data"), P("data")),
                         out_specs=(P(), P(), P()), check_vma=False)(params, momentum, x, y, mask)


def accum_dp_mean_of_means(params, momentum, x, y, mask, mesh):
    def local(params, momentum, x, y, mask):
        micro = jax.tree_util.tree_map(lambda a: a.reshape(N_MICRO, -1, *a.shape[1:]), (x, y, mask))

        def body(acc, batch):
            g_acc, l_acc = acc
            l, g = jax.value_and_grad(masked_mean_loss)(params, *batch)
            g_acc = jax.tree_util.tree_map(jnp.add, g_acc, g)
            return (g_acc, l_acc + l), None

        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        (g, l), _ = lax.scan(body, (zeros, 0.0), micro)
        g, l = lax.pmean((g, l), "data")
        g = jax.tree_util.tree_map(lambda gi: gi / N_MICRO, g)
        params, momentum = _sgd(params, momentum, g)
        return params, momentum, l / N_MICRO
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data"), P("data"), P("data")),
                         out_specs=(P(), P(), P()), check_vma=False)(params, momentum, x, y, mask)
