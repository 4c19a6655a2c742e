"""FSDP forward of a residual tanh stack with scan over layers and jax.checkpoint per layer.

Each layer's weight is stored split by *columns* over `fsdp` ([L, D, D/n] per device); inside the
scan the layer gathers it untiled ([n, D, D/n]) and rearranges it back by hand (einops
"n d c -> d (n c)"). The batch is split over the same axis.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

L, D = 3, 8


def stack_shapes():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(8, D), f(L, D, D), f(L, D)


def residual_stack(x, ws, bs):
    def body(h, wb):
        w, b = wb
        return h + jnp.tanh(h @ w + b), None

    return jax.lax.scan(jax.checkpoint(body), x, (ws, bs))[0]


def _n_d_c_to_d_nc(g):
    n, d, c = g.shape
    return jnp.transpose(g, (1, 0, 2)).reshape(d, n * c)


def _n_d_c_flat(g):
    n, d, c = g.shape
    return g.reshape(d, n * c)


def _fsdp_stack(x, ws, bs, mesh, rearrange):
    def local(x_blk, w_cols, bs):
        def body(h, wb):
            w_part, b = wb
            w = rearrange(jax.lax.all_gather(w_part, "fsdp"))
            return h + jnp.tanh(h @ w + b), None

        return jax.lax.scan(jax.checkpoint(body), x_blk, (w_cols, bs))[0]

    return jax.shard_map(local, mesh=mesh, in_specs=(P("fsdp"), P(None, None, "fsdp"), P()),
                         out_specs=P("fsdp"))(x, ws, bs)


def residual_stack_fsdp(x, ws, bs, mesh):
    return _fsdp_stack(x, ws, bs, mesh, _n_d_c_to_d_nc)


def residual_stack_fsdp_v2(x, ws, bs, mesh):
    return _fsdp_stack(x, ws, bs, mesh, _n_d_c_flat)
