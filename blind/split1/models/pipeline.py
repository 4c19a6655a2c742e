"""A stack of residual MLP layers run as a GPipe pipeline over the `pp` mesh axis."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

D, F = 16, 32


def layer(w1, w2, x):
    return x + jnp.tanh(x @ w1) @ w2


def stack(params, x):
    def one(h, w):
        return layer(w["w1"], w["w2"], h), None

    out, _ = lax.scan(one, x, params)
    return out


def _stack_inputs(n_layers, batch):
    f32 = jnp.float32
    return ({"w1": jax.ShapeDtypeStruct((n_layers, D, F), f32),
             "w2": jax.ShapeDtypeStruct((n_layers, F, D), f32)},
            jax.ShapeDtypeStruct((batch, D), f32))


# ---------------------------------------------------------------- one layer per stage
MICRO, MICRO_BATCH = 4, 2


def stack_inputs_4():
    return _stack_inputs(4, MICRO * MICRO_BATCH)


def _gpipe(params, x, mesh, shift):
    n = mesh.shape["pp"]

    def stage(w, x):
        me = lax.axis_index("pp")
        micro = x.reshape(MICRO, MICRO_BATCH, D)

        def tick(carry, t):
            incoming, outs = carry
            feed = jnp.where(me == 0, micro[jnp.minimum(t, MICRO - 1)], incoming)
            y = layer(w["w1"][0], w["w2"][0], feed)
            finished = t - (n - 1)
            write = (me == n - 1) & (finished >= 0)
            outs = jnp.where(write, outs.at[jnp.maximum(finished, 0)].set(y), outs)
            return (lax.ppermute(y, "pp", shift(n)), outs), None

        init = (jnp.zeros((MICRO_BATCH, D)), jnp.zeros((MICRO, MICRO_BATCH, D)))
        init = jax.tree.map(lambda a: lax.pcast(a, "pp", to="varying"), init)
        (_, outs), _ = lax.scan(tick, init, jnp.arange(MICRO + n - 1))
        return lax.psum(outs, "pp").reshape(MICRO * MICRO_BATCH, D)

    return jax.shard_map(stage, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P())(params, x)


def stack_gpipe(params, x, mesh):
    return _gpipe(params, x, mesh, lambda n: [(i, (i + 1) % n) for i in range(n)])


def stack_gpipe_v2(params, x, mesh):
    return _gpipe(params, x, mesh, lambda n: [((i + 1) % n, i) for i in range(n)])


# ---------------------------------------------------------------- several layers per stage, DP
def stack_inputs_dp():
    return _stack_inputs(4, 8)


def stack_pp_dp(params, x, mesh):
    n_stages = mesh.shape["pp"]
    n_micro = 2

    def stage(w1, w2, x):
        me = lax.axis_index("pp")
        micro = x.reshape(n_micro, -1, D)

        def run_stage(h):
            return stack({"w1": w1, "w2": w2}, h)

        def tick(t, carry):
            incoming, outs = carry
            fresh = lax.dynamic_index_in_dim(micro, jnp.clip(t, 0, n_micro - 1), keepdims=False)
            y = run_stage(jnp.where(me == 0, fresh, incoming))
            slot = t - (n_stages - 1)
            keep = (me == n_stages - 1) & (slot >= 0) & (slot < n_micro)
            updated = lax.dynamic_update_index_in_dim(outs, y, jnp.clip(slot, 0, n_micro - 1), 0)
            outs = jnp.where(keep, updated, outs)
            nxt = lax.ppermute(y, "pp", [(i, i + 1) for i in range(n_stages - 1)])
            return nxt, outs

        _, outs = lax.fori_loop(0, n_micro + n_stages - 1, tick,
                                (jnp.zeros_like(micro[0]), jnp.zeros_like(micro)))
        mine = jnp.where(me == n_stages - 1, outs, 0.0)
        return lax.psum(mine, "pp").reshape(x.shape)

    fn = jax.shard_map(stage, mesh=mesh, in_specs=(P("pp"), P("pp"), P("dp")),
                       out_specs=P("dp"), check_vma=False)
    return fn(params["w1"], params["w2"], x)
