"""GPipe schedule over 4 stages with lax.fori_loop: microbatches enter stage 0 one per tick,
activations move one stage forward per tick with ppermute, the last stage collects the outputs."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

STAGES, MICRO, MB, WIDTH = 4, 4, 2, 8


def stage_fn(w, b, h):
    return jnp.tanh(h @ w + b)


def sequential(ws, bs, xs):
    """ws [STAGES, W, W], bs [STAGES, W], xs [MICRO, MB, W]."""
    def layer(h, wb):
        return stage_fn(wb[0], wb[1], h), None

    run = lambda x: lax.scan(layer, x, (ws, bs))[0]
    return jax.vmap(run)(xs)


def _gpipe(n_ticks):
    def local(w, b, xs):
        w, b = w[0], b[0]
        stage = lax.axis_index("pp")
        fwd = [(s, s + 1) for s in range(STAGES - 1)]

        def tick(t, carry):
            inflight, outs = carry
            feed = lax.dynamic_index_in_dim(xs, jnp.minimum(t, MICRO - 1), keepdims=False)
            h = jnp.where(stage == 0, feed, inflight)
            h = stage_fn(w, b, h)
            done = t - (STAGES - 1)
            write = (stage == STAGES - 1) & (done >= 0)
            slot = jnp.clip(done, 0, MICRO - 1)
            cur = lax.dynamic_index_in_dim(outs, slot, keepdims=False)
            outs = lax.dynamic_update_index_in_dim(outs, jnp.where(write, h, cur), slot, 0)
            return lax.ppermute(h, "pp", fwd), outs

        init = (jnp.zeros((MB, WIDTH), xs.dtype), jnp.zeros_like(xs))
        _, outs = lax.fori_loop(0, n_ticks, tick, init)
        return lax.psum(jnp.where(stage == STAGES - 1, outs, 0.0), "pp")

    return jax.shard_map(local, in_specs=(P("pp"), P("pp"), P()), out_specs=P(), check_vma=False)


def gpipe(ws, bs, xs):
    return _gpipe(MICRO + STAGES - 1)(ws, bs, xs)


def gpipe_short_schedule(ws, bs, xs):
    return _gpipe(MICRO + STAGES - 2)(ws, bs, xs)


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((STAGES, WIDTH, WIDTH), f), jax.ShapeDtypeStruct((STAGES, WIDTH), f),
            jax.ShapeDtypeStruct((MICRO, MB, WIDTH), f))
