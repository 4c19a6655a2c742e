# Pipeline over 'pp' with two residual layers per stage; the reference is itself a scan over the
# stacked layers. The schedule is a lax.scan whose carry is a tuple of several arrays.
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

LAYERS, STAGES, MICRO, ROWS, FEAT = 8, 4, 3, 2, 8


class Stack(NamedTuple):
    w: jax.Array      # [LAYERS, FEAT, FEAT]
    gain: jax.Array   # [LAYERS, FEAT]


def inputs():
    f = jnp.float32
    return (Stack(jax.ShapeDtypeStruct((LAYERS, FEAT, FEAT), f), jax.ShapeDtypeStruct((LAYERS, FEAT), f)),
            jax.ShapeDtypeStruct((MICRO, ROWS, FEAT), f))


def res_layer(h, p):
    w, gain = p
    return h + gain * jax.nn.silu(h @ w), None


def run_stack(stack: Stack, xs):
    out, _ = lax.scan(res_layer, xs, (stack.w, stack.gain))
    return out


def _pipelined(stack, xs, mesh, out_stage_fn):
    def per_stage(local: Stack, xs):
        me = lax.axis_index("pp")
        shift = [(i, i + 1) for i in range(STAGES - 1)]

        def step(carry, t):
            buf, outs, count = carry
            x_in = jnp.where(me == 0, xs[jnp.minimum(t, MICRO - 1)], buf)
            y = run_stack(local, x_in)
            slot = t - (STAGES - 1)
            write = (me == out_stage_fn(STAGES)) & (slot >= 0)
            outs = outs.at[jnp.clip(slot, 0, MICRO - 1)].add(jnp.where(write, y, 0.0))
            return (lax.ppermute(y, "pp", shift), outs, count + write.astype(jnp.int32)), None

        init = (jnp.zeros_like(xs[0]), jnp.zeros_like(xs), jnp.int32(0))
        (_, outs, _), _ = lax.scan(step, init, jnp.arange(MICRO + STAGES - 1))
        return lax.psum(outs, "pp")

    return jax.shard_map(per_stage, mesh=mesh, in_specs=(Stack(P("pp"), P("pp")), P()),
                         out_specs=P(), check_vma=False)(stack, xs)


def run_stack_pp(stack, xs, mesh):
    return _pipelined(stack, xs, mesh, lambda n: n - 1)


def run_stack_pp_first(stack, xs, mesh):
    return _pipelined(stack, xs, mesh, lambda n: 0)
