"""A two-step training loop for a small tanh MLP regressor (mean squared error): each step takes
`jax.value_and_grad` of the batch loss and applies a hand-written Adagrad update (accumulator
started at 0.1, update lr * g / (sqrt(acc) + eps)) over the parameter pytree with
`jax.tree_util.tree_map`. Returns the final parameters, the accumulators and the two losses.

Data parallel over {data: 4}: every step's batch is sharded over data.
- `train_dp_pmean`: local mean loss, gradients and loss `pmean`-ed over data;
- `train_dp_microbatched`: each device splits its shard into 2 microbatches read with
  `lax.dynamic_slice_in_dim` inside a `fori_loop`, sums the microbatch gradients of the summed
  squared error, and divides the psum by the global example count.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

STEPS, B, DIN, HID, DOUT = 2, 16, 8, 16, 4
LR, EPS, ACC0 = 0.1, 1e-8, 0.1
NDEV, MICRO = 4, 2
B_LOCAL = B // NDEV
MB = B_LOCAL // MICRO


def train_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(DIN, HID), "b1": f(HID), "w2": f(HID, DOUT)}
    return params, f(STEPS, B, DIN), f(STEPS, B, DOUT)


def sq_err(params, x, y):
    pred = jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]
    return jnp.sum((pred - y) ** 2) / DOUT


def adagrad(params, acc, grads):
    acc = jax.tree_util.tree_map(lambda a, g: a + g * g, acc, grads)
    params = jax.tree_util.tree_map(lambda p, g, a: p - LR * g / (jnp.sqrt(a) + EPS),
                                    params, grads, acc)
    return params, acc


def train(params, xs, ys):
    acc = jax.tree_util.tree_map(lambda p: jnp.full_like(p, ACC0), params)
    losses = []
    for t in range(STEPS):
        loss, grads = jax.value_and_grad(lambda p: sq_err(p, xs[t], ys[t]) / B)(params)
        params, acc = adagrad(params, acc, grads)
        losses.append(loss)
    return params, acc, jnp.stack(losses)


def _run(local, params, xs, ys, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "data"), P(None, "data")),
                         out_specs=(P(), P(), P()), check_vma=False)(params, xs, ys)


# ---- pmean of local means -----------------------------------------------------------------------

def _pmean_local(reduce_grads):
    def local(params, xs, ys):
        acc = jax.tree_util.tree_map(lambda p: jnp.full_like(p, ACC0), params)
        losses = []
        for t in range(STEPS):
            loss, grads = jax.value_and_grad(lambda p: sq_err(p, xs[t], ys[t]) / B_LOCAL)(params)
            params, acc = adagrad(params, acc, reduce_grads(grads))
            losses.append(lax.pmean(loss, "data"))
        return params, acc, jnp.stack(losses)
    return local


def train_dp_pmean(params, xs, ys, mesh):
    return _run(_pmean_local(lambda g: lax.pmean(g, "data")), params, xs, ys, mesh)


def train_dp_psum(params, xs, ys, mesh):
    return _run(_pmean_local(lambda g: lax.psum(g, "data")), params, xs, ys, mesh)


# ---- microbatches in fori_loop ------------------------------------------------------------------

def _micro(t, i):
    return lax.dynamic_slice_in_dim(t, i * MB, MB)


def _micro_unscaled(t, i):
    return lax.dynamic_slice_in_dim(t, i, MB)


def _micro_local(micro):
    def local(params, xs, ys):
        acc = jax.tree_util.tree_map(lambda p: jnp.full_like(p, ACC0), params)
        losses = []
        for t in range(STEPS):
            def body(i, carry, x=xs[t], y=ys[t]):
                loss_sum, g_sum = carry
                l, g = jax.value_and_grad(sq_err)(params, micro(x, i), micro(y, i))
                return loss_sum + l, jax.tree_util.tree_map(jnp.add, g_sum, g)

            zero = (jnp.zeros(()), jax.tree_util.tree_map(jnp.zeros_like, params))
            loss_sum, g_sum = lax.fori_loop(0, MICRO, body, zero)
            grads = jax.tree_util.tree_map(lambda g: lax.psum(g, "data") / B, g_sum)
            params, acc = adagrad(params, acc, grads)
            losses.append(lax.psum(loss_sum, "data") / B)
        return params, acc, jnp.stack(losses)
    return local


def train_dp_microbatched(params, xs, ys, mesh):
    return _run(_micro_local(_micro), params, xs, ys, mesh)


def train_dp_microbatched_slice_start(params, xs, ys, mesh):
    return _run(_micro_local(_micro_unscaled), params, xs, ys, mesh)
