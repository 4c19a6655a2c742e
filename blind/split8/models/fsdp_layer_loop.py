"""Deep linear-tanh stack with row-sharded stacked weights, gathered one layer at a time."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_LAYERS, WIDTH, N_EXAMPLES = 3, 8, 8


def regression_loss(weights, biases, x, target):
    def body(i, h):
        return jnp.tanh(h @ weights[i] + biases[i])

    out = lax.fori_loop(0, N_LAYERS, body, x)
    return jnp.mean(jnp.square(out - target))


def shapes():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((N_LAYERS, WIDTH, WIDTH), f),
            jax.ShapeDtypeStruct((N_LAYERS, WIDTH), f),
            jax.ShapeDtypeStruct((N_EXAMPLES, WIDTH), f),
            jax.ShapeDtypeStruct((N_EXAMPLES, WIDTH), f))


def _sharded_loss(reduce_axes):
    def per_device(w_rows, biases, x, target):
        def body(i, h):
            w = lax.all_gather(w_rows[i], "fsdp", axis=0, tiled=True)
            return jnp.tanh(h @ w + biases[i])

        out = lax.fori_loop(0, N_LAYERS, body, x)
        return lax.pmean(jnp.mean(jnp.square(out - target)), reduce_axes)

    return per_device


def regression_loss_fsdp(weights, biases, x, target):
    batch = P(("dp", "fsdp"))
    fn = jax.shard_map(_sharded_loss(("dp", "fsdp")),
                       in_specs=(P(None, "fsdp"), P(), batch, batch),
                       out_specs=P(), check_vma=False)
    return fn(weights, biases, x, target)


def regression_loss_fsdp_v2(weights, biases, x, target):
    batch = P(("dp", "fsdp"))
    fn = jax.shard_map(_sharded_loss("fsdp"),
                       in_specs=(P(None, "fsdp"), P(), batch, batch),
                       out_specs=P(), check_vma=False)
    return fn(weights, biases, x, target)
