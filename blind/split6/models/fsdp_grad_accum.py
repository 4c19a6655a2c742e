"""FSDP training step with gradient accumulation: microbatches are scanned, the flat parameter
vector is all-gathered inside the loss (its gradient comes back reduce-scattered), the mean
gradient feeds an SGD update with weight decay."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_IN, N_OUT = 6, 4
N_PARAMS = N_IN * N_OUT + N_OUT            # w (row-major) then b
N_MICRO, MICRO_ROWS, N_DEV = 2, 8, 4
LR, WD = 0.05, 0.01


def unpack(flat):
    return flat[: N_IN * N_OUT].reshape(N_IN, N_OUT), flat[N_IN * N_OUT:]


def loss_fn(flat, x, y):
    w, b = unpack(flat)
    logits = x @ w + b
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.sum(logits * y, -1))


def step(flat, xs, ys):
    """flat [N_PARAMS]; xs [N_MICRO, N_DEV*MICRO_ROWS, N_IN]; ys matching one-hot-ish targets."""
    def acc(g_sum, batch):
        loss, g = jax.value_and_grad(loss_fn)(flat, *batch)
        return g_sum + g, loss

    g_sum, losses = lax.scan(acc, jnp.zeros_like(flat), (xs, ys))
    grad = g_sum / N_MICRO
    return flat - LR * (grad + WD * flat), jnp.mean(losses)


def _fsdp_step(sum_micro=False):
    def local(flat_shard, xs, ys):
        def sharded_loss(shard, x, y):
            return loss_fn(lax.all_gather(shard, "fsdp", tiled=True), x, y)

        def acc(g_sum, batch):
            loss, g = jax.value_and_grad(sharded_loss)(flat_shard, *batch)
            return g_sum + g, loss

        g_sum, losses = lax.scan(acc, jnp.zeros_like(flat_shard), (xs, ys))
        # the reduce-scattered gradient is a sum over the N_DEV data shards
        if sum_micro:
            grad = g_sum / N_DEV
        else:
            grad = g_sum / (N_MICRO * N_DEV)
        new = flat_shard - LR * (grad + WD * flat_shard)
        return new, lax.pmean(jnp.mean(losses), "fsdp")

    return jax.shard_map(local, in_specs=(P("fsdp"), P(None, "fsdp"), P(None, "fsdp")),
                         out_specs=(P("fsdp"), P()), check_vma=False)


def step_fsdp(flat, xs, ys):
    return _fsdp_step()(flat, xs, ys)


def step_fsdp_sum_micro(flat, xs, ys):
    return _fsdp_step(sum_micro=True)(flat, xs, ys)


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((N_PARAMS,), f),
            jax.ShapeDtypeStruct((N_MICRO, N_DEV * MICRO_ROWS, N_IN), f),
            jax.ShapeDtypeStruct((N_MICRO, N_DEV * MICRO_ROWS, N_OUT), f))
