"""Pipeline parallelism over {pp: 4}: 8 pre-LN residual tanh layers (2 per stage, weights stacked
[S, 2, D, D] and split over pp), M microbatches pushed through on a tick schedule; stage 0 injects
microbatch t at tick t, activations shift one stage per tick with ppermute, the last stage emits
microbatch t - S + 1.

- `pipeline_fori`: fori_loop over ticks, the last stage writes its output slot with
  dynamic_update_slice, outputs psum'd over pp;
- `pipeline_scan`: lax.scan over ticks (an inner scan over the stage's two layers), per-tick outputs
  stacked and the last S - 1 ticks' warm-up dropped, then psum'd from the last stage.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

S, LPS, M, MB, D = 4, 2, 4, 2, 16


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w": f(S, LPS, D, D), "g": f(S, LPS, D)}, f(M, MB, D)


def _layer(h, w, g):
    mu = h.mean(-1, keepdims=True)
    n = (h - mu) * lax.rsqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g
    return h + jnp.tanh(n @ w)


def forward(p, xs):
    w, g = p["w"].reshape(S * LPS, D, D), p["g"].reshape(S * LPS, D)
    h = xs
    for l in range(S * LPS):
        h = _layer(h, w[l], g[l])
    return h


def _stage(w, g, h):
    return lax.scan(lambda h, wg: (_layer(h, *wg), None), h, (w[0], g[0]))[0]


SHIFT = [(i, (i + 1) % S) for i in range(S)]


def _fori_local(p, xs, out_slot):
    idx = lax.axis_index("pp")

    def tick(t, carry):
        state, out = carry
        state = jnp.where(idx == 0, xs[jnp.minimum(t, M - 1)], state)
        state = _stage(p["w"], p["g"], state)
        slot = out_slot(t)
        valid = (idx == S - 1) & (slot >= 0) & (slot < M)
        written = lax.dynamic_update_slice_in_dim(out, state[None], jnp.clip(slot, 0, M - 1), 0)
        out = jnp.where(valid, written, out)
        return lax.ppermute(state, "pp", SHIFT), out

    _, out = lax.fori_loop(0, M + S - 1, tick, (jnp.zeros((MB, D)), jnp.zeros((M, MB, D))))
    return lax.psum(out, "pp")


def _run(fn, p, xs, mesh):
    return jax.shard_map(fn, mesh=mesh, in_specs=({"w": P("pp"), "g": P("pp")}, P()), out_specs=P(),
                         check_vma=False)(p, xs)


def pipeline_fori(p, xs, mesh):
    return _run(lambda p, xs: _fori_local(p, xs, lambda t: t - S + 1), p, xs, mesh)


def pipeline_fori_slot_off_by_one(p, xs, mesh):
    return _run(lambda p, xs: _fori_local(p, xs, lambda t: t - S), p, xs, mesh)


def _scan_local(p, xs, send):
    idx = lax.axis_index("pp")
    feed = jnp.concatenate([xs, jnp.zeros((S - 1, MB, D))], axis=0)

    def tick(state, x_t):
        state = _stage(p["w"], p["g"], jnp.where(idx == 0, x_t, state))
        return send(state), jnp.where(idx == S - 1, state, 0.0)

    _, ys = lax.scan(tick, jnp.zeros((MB, D)), feed)
    return lax.psum(ys[S - 1:], "pp")


def pipeline_scan(p, xs, mesh):
    return _run(lambda p, xs: _scan_local(p, xs, lambda s: lax.ppermute(s, "pp", SHIFT)), p, xs, mesh)


def pipeline_scan_shift_reversed(p, xs, mesh):
    return _run(lambda p, xs: _scan_local(p, xs, lambda s: lax.ppermute(s, "pp", [(i, (i - 1) % S) for i in range(S)])), p, xs, mesh)
