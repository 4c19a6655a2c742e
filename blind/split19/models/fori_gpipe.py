"""GPipe schedule written as a `lax.fori_loop` over clock ticks with an explicit output buffer:
stage s works on microbatch t - s at tick t, activations move to the next stage by `ppermute`, and
the last stage writes its result into the buffer at row t - (S - 1) with `dynamic_update_slice`.
Each layer is a residual tanh MLP; the reference runs the layers in order on every microbatch.

- `gpipe`: on {pp: 4}, one layer per stage;
- `gpipe_tp`: on {pp: 2, tp: 2}, two layers per stage, each layer's MLP split over tp (columns of
  w1, rows of w2) and reduced with psum over tp.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

L, M, MB, D, F = 4, 4, 2, 16, 32


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(L, D, F), f(L, F, D), f(M, MB, D)


def _layer(w1, w2, x):
    return x + jnp.tanh(x @ w1) @ w2


def pipeline(w1, w2, xs):
    def one(x):
        for i in range(L):
            x = _layer(w1[i], w2[i], x)
        return x
    return jax.vmap(one)(xs)


def _out_row(t, stages):
    return t - (stages - 1)


def _out_row_one_late(t, stages):
    return t - stages


def _schedule(stage_fn, xs, out_row):
    stages = lax.axis_size("pp")
    s = lax.axis_index("pp")
    ring = [(i, i + 1) for i in range(stages - 1)]

    def tick(t, carry):
        state, out = carry
        fresh = lax.dynamic_index_in_dim(xs, jnp.minimum(t, M - 1), keepdims=False)
        x = jnp.where(s == 0, fresh, state)
        y = stage_fn(x)
        row = jnp.clip(out_row(t, stages), 0, M - 1)
        write = (s == stages - 1) & (t >= stages - 1)
        out = jnp.where(write, lax.dynamic_update_index_in_dim(out, y, row, 0), out)
        return lax.ppermute(y, "pp", perm=ring), out

    init = (jnp.zeros_like(xs[0]), jnp.zeros_like(xs))
    _, out = lax.fori_loop(0, M + stages - 1, tick, init)
    return lax.psum(jnp.where(s == stages - 1, out, 0.0), "pp")


# ---- one layer per stage ------------------------------------------------------------------------

def _gpipe(w1, w2, xs, mesh, out_row):
    def local(w1, w2, xs):
        return _schedule(lambda x: _layer(w1[0], w2[0], x), xs, out_row)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("pp"), P("pp"), P()), out_specs=P(),
                         check_vma=False)(w1, w2, xs)


def gpipe(w1, w2, xs, mesh):
    return _gpipe(w1, w2, xs, mesh, _out_row)


def gpipe_output_row_one_late(w1, w2, xs, mesh):
    return _gpipe(w1, w2, xs, mesh, _out_row_one_late)


# ---- two layers per stage, tensor parallel inside the stage -------------------------------------

def _tp_layer(w1, w2, x, axis):
    return x + lax.psum(jnp.tanh(x @ w1) @ w2, axis)


def _gpipe_tp(w1, w2, xs, mesh, axis):
    def local(w1, w2, xs):
        def stage(x):
            for i in range(w1.shape[0]):
                x = _tp_layer(w1[i], w2[i], x, axis)
            return x
        return _schedule(stage, xs, _out_row)
    return jax.shard_map(local, mesh=mesh,
                         in_specs=(P("pp", None, "tp"), P("pp", "tp", None), P()),
                         out_specs=P(), check_vma=False)(w1, w2, xs)


def gpipe_tp(w1, w2, xs, mesh):
    return _gpipe_tp(w1, w2, xs, mesh, "tp")


def gpipe_tp_reduce_over_pp(w1, w2, xs, mesh):
    return _gpipe_tp(w1, w2, xs, mesh, "pp")
