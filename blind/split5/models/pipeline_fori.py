# Two-stage pipeline over 'pp' written with lax.fori_loop; each stage owns two consecutive
# residual layers of a stacked [4, D, D] weight and runs them with lax.scan.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

LAYERS, D, MICRO, MB = 4, 8, 3, 4


def make_args():
    return (jax.ShapeDtypeStruct((LAYERS, D, D), jnp.float32),
            jax.ShapeDtypeStruct((MICRO, MB, D), jnp.float32))


def _layer(h, w):
    return h + jnp.tanh(h @ w), None


def stack_forward(w_stack, xs):
    out, _ = lax.scan(_layer, xs, w_stack)
    return out


def stack_forward_pp(w_stack, xs, mesh):
    n = mesh.shape["pp"]

    def per_stage(w_local, xs):
        me = lax.axis_index("pp")

        def step(t, carry):
            state, outs = carry
            fresh = lax.dynamic_index_in_dim(xs, jnp.minimum(t, MICRO - 1), keepdims=False)
            state = jnp.where(me == 0, fresh, state)
            state, _ = lax.scan(_layer, state, w_local)
            j = t - (n - 1)
            write = (me == n - 1) & (j >= 0)
            slot = jnp.clip(j, 0, MICRO - 1)
            cur = lax.dynamic_index_in_dim(outs, slot, keepdims=False)
            outs = lax.dynamic_update_index_in_dim(outs, jnp.where(write, state, cur), slot, 0)
            state = lax.ppermute(state, "pp", [(s, (s + 1) % n) for s in range(n)])
            return state, outs

        init = (jnp.zeros((MB, D), xs.dtype), jnp.zeros_like(xs))
        _, outs = lax.fori_loop(0, MICRO + n - 1, step, init)
        return lax.psum(outs, "pp")

    return jax.shard_map(per_stage, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P(),
                         check_vma=False)(w_stack, xs)
