"""FSDP training step: each device stores a row shard of every weight, all-gathers it for the
forward pass; the backward pass of the all-gather reduce-scatters the gradient back to the shard
owner, which applies Adam-free SGD to its own rows only."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D_IN, D_H = 16, 8, 16
LR = 0.05


def net_loss(w_a, w_b, x, t):
    return jnp.mean((jax.nn.relu(x @ w_a) @ w_b - t) ** 2)


def train_step(w_a, w_b, x, t):
    loss, (g_a, g_b) = jax.value_and_grad(net_loss, argnums=(0, 1))(w_a, w_b, x, t)
    return w_a - LR * g_a, w_b - LR * g_b, loss


def train_step_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((D_IN, D_H), f32),
        jax.ShapeDtypeStruct((D_H, D_IN), f32),
        jax.ShapeDtypeStruct((N, D_IN), f32),
        jax.ShapeDtypeStruct((N, D_IN), f32),
    )


def train_step_fsdp(w_a, w_b, x, t, mesh):
    n_dev = mesh.shape["fsdp"]

    def device(a_rows, b_rows, xb, tb):
        def local_loss(a_rows, b_rows):
            a = lax.all_gather(a_rows, "fsdp", axis=0, tiled=True)
            b = lax.all_gather(b_rows, "fsdp", axis=0, tiled=True)
            return net_loss(a, b, xb, tb)

        loss, (g_a, g_b) = jax.value_and_grad(local_loss, argnums=(0, 1))(a_rows, b_rows)
        g_a, g_b = g_a / n_dev, g_b / n_dev
        return a_rows - LR * g_a, b_rows - LR * g_b, lax.pmean(loss, "fsdp")

    rows = P("fsdp", None)
    return jax.shard_map(
        device, mesh=mesh, in_specs=(rows, rows, rows, rows), out_specs=(rows, rows, P()), check_vma=False
    )(w_a, w_b, x, t)
