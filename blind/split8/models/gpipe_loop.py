"""4-stage pipeline (one tanh layer per stage) over microbatches; GPipe schedule with fori_loop."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

STAGES, MICRO, MB, WIDTH = 4, 4, 2, 8


def stage_fn(w, b, h):
    return jnp.tanh(h @ w + b)


def sequential(ws, bs, xs):
    def one(x):
        for s in range(STAGES):
            x = stage_fn(ws[s], bs[s], x)
        return x
    return jax.vmap(one)(xs)


def pipeline_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((STAGES, WIDTH, WIDTH), f),
            jax.ShapeDtypeStruct((STAGES, WIDTH), f),
            jax.ShapeDtypeStruct((MICRO, MB, WIDTH), f))


def _gpipe(shift):
    def run(ws, bs, xs):
        stage = lax.axis_index("pp")
        n = lax.axis_size("pp")
        w, b = ws[0], bs[0]

        def tick(t, carry):
            state, outs = carry
            inject = xs[jnp.minimum(t, MICRO - 1)]
            state = jnp.where((stage == 0) & (t < MICRO), inject, state)
            state = stage_fn(w, b, state)
            done = t - (n - 1)
            keep = (stage == n - 1) & (done >= 0)
            outs = jnp.where(keep, lax.dynamic_update_index_in_dim(outs, state, jnp.maximum(done, 0), 0), outs)
            state = lax.ppermute(state, "pp", shift(n))
            return state, outs

        init = (jnp.zeros((MB, WIDTH), xs.dtype), jnp.zeros_like(xs))
        init = lax.pcast(init, "pp", to="varying")
        _, outs = lax.fori_loop(0, MICRO + STAGES - 1, tick, init)
        return lax.psum(outs, "pp")

    return run


def gpipe(ws, bs, xs):
    fwd = _gpipe(lambda n: [(i, (i + 1) % n) for i in range(n)])
    return jax.shard_map(fwd, in_specs=(P("pp"), P("pp"), P()), out_specs=P())(ws, bs, xs)


def gpipe_v2(ws, bs, xs):
    fwd = _gpipe(lambda n: [((i + 1) % n, i) for i in range(n)])
    return jax.shard_map(fwd, in_specs=(P("pp"), P("pp"), P()), out_specs=P())(ws, bs, xs)
