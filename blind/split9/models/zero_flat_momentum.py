"""ZeRO-2 style data-parallel step on a flat parameter vector.

Every replica keeps the full flat parameters but only its 1/n slice of the momentum; gradients are
reduce-scattered (psum_scatter, tiled), the replica updates its slice and the slices are
all-gathered back.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D_IN, D_OUT = 8, 4
N_FLAT = D_IN * D_OUT + D_OUT  # 36, divisible by the 4 replicas
LR, BETA = 0.05, 0.9


def flat_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(N_FLAT), f(N_FLAT), f(16, D_IN), f(16, D_OUT)


def unflatten(flat):
    return flat[: D_IN * D_OUT].reshape(D_IN, D_OUT), flat[D_IN * D_OUT:]


def objective(flat, x, y):
    w, b = unflatten(flat)
    return jnp.mean((x @ w + b - y) ** 2)


def momentum_step(flat, mom, x, y):
    g = jax.grad(objective)(flat, x, y)
    mom = BETA * mom + g
    return flat - LR * mom, mom


def _own_slice_rows(flat, n, i):
    return flat.reshape(n, -1)[i]


def _own_slice_strided(flat, n, i):
    return flat.reshape(-1, n)[:, i]


def _zero_step(flat, mom, x, y, mesh, own_slice):
    def replica(flat, mom_slice, x, y):
        n = lax.axis_size("dp")
        g = jax.grad(objective)(flat, x, y)
        g_slice = lax.psum_scatter(g, "dp", scatter_dimension=0, tiled=True) / n
        mom_slice = BETA * mom_slice + g_slice
        p_slice = own_slice(flat, n, lax.axis_index("dp")) - LR * mom_slice
        return lax.all_gather(p_slice, "dp", tiled=True), mom_slice

    return jax.shard_map(replica, mesh=mesh, in_specs=(P(), P("dp"), P("dp"), P("dp")),
                         out_specs=(P(), P("dp")), check_vma=False)(flat, mom, x, y)


def momentum_step_zero(flat, mom, x, y, mesh):
    return _zero_step(flat, mom, x, y, mesh, _own_slice_rows)


def momentum_step_zero_v2(flat, mom, x, y, mesh):
    return _zero_step(flat, mom, x, y, mesh, _own_slice_strided)
