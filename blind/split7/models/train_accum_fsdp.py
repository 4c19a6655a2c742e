# FSDP training step with gradient accumulation over microbatches (lax.scan), momentum SGD.
# Weights and optimizer state stay sharded; each microbatch gathers the weight, and the
# gradient of the gathered weight is reduce-scattered back to the shards.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

MICRO, MB_ROWS, D, K = 3, 4, 8, 8
LR, MOMENTUM = 0.05, 0.9


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((D, K), f), jax.ShapeDtypeStruct((D, K), f),
            jax.ShapeDtypeStruct((MICRO, MB_ROWS, D), f), jax.ShapeDtypeStruct((MICRO, MB_ROWS, K), f))


def micro_loss(w, xb, yb):
    return jnp.mean(jnp.sum((jnp.tanh(xb @ w) - yb) ** 2, axis=-1))


def train_step(w, velocity, xs, ys):
    def accum(carry, batch):
        loss_sum, grad_sum = carry
        loss, g = jax.value_and_grad(micro_loss)(w, *batch)
        return (loss_sum + loss, grad_sum + g), None

    (loss_sum, grad_sum), _ = lax.scan(accum, (0.0, jnp.zeros_like(w)), (xs, ys))
    velocity = MOMENTUM * velocity + grad_sum / MICRO
    return w - LR * velocity, velocity, loss_sum / MICRO


def _train_step_fsdp(w, velocity, xs, ys, mesh, n_micro_divisor):
    def per_device(w_shard, v_shard, xs, ys):
        n = lax.axis_size("fsdp")

        def accum(carry, batch):
            loss_sum, grad_sum = carry
            w_full = lax.all_gather(w_shard, "fsdp", tiled=True)
            loss, g_full = jax.value_and_grad(micro_loss)(w_full, *batch)
            g = lax.psum_scatter(g_full, "fsdp", tiled=True)
            return (loss_sum + loss, grad_sum + g), None

        (loss_sum, grad_sum), _ = lax.scan(accum, (0.0, jnp.zeros_like(w_shard)), (xs, ys))
        grad = grad_sum / (n_micro_divisor * n)
        v_new = MOMENTUM * v_shard + grad
        loss = lax.pmean(loss_sum, "fsdp") / MICRO
        return w_shard - LR * v_new, v_new, loss

    rows = P("fsdp", None)
    return jax.shard_map(per_device, mesh=mesh,
                         in_specs=(rows, rows, P(None, "fsdp"), P(None, "fsdp")),
                         out_specs=(rows, rows, P()), check_vma=False)(w, velocity, xs, ys)


def train_step_fsdp(w, velocity, xs, ys, mesh):
    return _train_step_fsdp(w, velocity, xs, ys, mesh, MICRO)


def train_step_fsdp_accum(w, velocity, xs, ys, mesh):
    return _train_step_fsdp(w, velocity, xs, ys, mesh, 1)
