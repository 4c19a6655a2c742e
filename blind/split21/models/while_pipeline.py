"""Pipeline-parallel residual MLP stack (pre-LayerNorm, GELU) with microbatches.

- `gpipe_while` on {pp: 4}: one layer per stage; a `lax.while_loop` over M + P - 1 ticks; stage 0
  injects microbatch t, activations move to the next stage with ppermute, the last stage stores
  finished microbatch t - (P - 1), and a masked psum replicates the result;
- `stages_unrolled` on {pp: 4}: eight layers, two per stage (a `lax.scan` over the stage's local
  layers), a Python-unrolled tick loop writing finished microbatches with `jnp.where`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, M = 8, 16, 32, 4
MB = N // M


def inputs4():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(4, D), f(4, D, F), f(4, F, D), f(N, D)


def inputs8():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(8, D), f(8, D, F), f(8, F, D), f(N, D)


def _layer(x, g, w1, w2):
    mu = x.mean(-1, keepdims=True)
    h = (x - mu) * lax.rsqrt(jnp.square(x - mu).mean(-1, keepdims=True) + 1e-5) * g
    return x + jax.nn.gelu(h @ w1) @ w2


def stack(g, w1, w2, x):
    for i in range(g.shape[0]):
        x = _layer(x, g[i], w1[i], w2[i])
    return x


def _forward_perm(n):
    return [(i, (i + 1) % n) for i in range(n)]


def _backward_perm(n):
    return [(i, (i - 1) % n) for i in range(n)]


def _gpipe_local(g, w1, w2, x, perm):
    n, me = lax.axis_size("pp"), lax.axis_index("pp")
    mbs = x.reshape(M, MB, D)

    def cond(c):
        return c[0] < M + n - 1

    def body(c):
        t, state, out = c
        inject = mbs[jnp.minimum(t, M - 1)]
        state = jnp.where(me == 0, inject, state)
        state = _layer(state, g[0], w1[0], w2[0])
        done = t - (n - 1)
        store = (me == n - 1) & (done >= 0)
        out = jnp.where(store, lax.dynamic_update_index_in_dim(out, state, jnp.maximum(done, 0), 0), out)
        return t + 1, lax.ppermute(state, "pp", perm(n)), out

    _, _, out = lax.while_loop(cond, body, (0, jnp.zeros((MB, D)), jnp.zeros((M, MB, D))))
    return lax.psum(jnp.where(me == n - 1, out, 0.0), "pp").reshape(N, D)


def _run_gpipe(g, w1, w2, x, mesh, perm):
    local = lambda *a: _gpipe_local(*a, perm)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P("pp"), P("pp"), P("pp"), P()),
                         out_specs=P())(g, w1, w2, x)


def gpipe_while(g, w1, w2, x, mesh):
    return _run_gpipe(g, w1, w2, x, mesh, _forward_perm)


def gpipe_while_reversed_ring(g, w1, w2, x, mesh):
    return _run_gpipe(g, w1, w2, x, mesh, _backward_perm)


def _finished(t, n):
    return t - (n - 1)


def _finished_one_late(t, n):
    return t - n


def _unrolled_local(g, w1, w2, x, finished):
    n, me = lax.axis_size("pp"), lax.axis_index("pp")
    mbs = x.reshape(M, MB, D)
    run_stage = lambda h: lax.scan(lambda h, p: (_layer(h, *p), None), h, (g, w1, w2))[0]
    state, outs = jnp.zeros((MB, D)), [jnp.zeros((MB, D)) for _ in range(M)]
    for t in range(M + n - 1):
        if t < M:
            state = jnp.where(me == 0, mbs[t], state)
        state = run_stage(state)
        j = finished(t, n)
        if 0 <= j < M:
            outs[j] = jnp.where(me == n - 1, state, outs[j])
        state = lax.ppermute(state, "pp", _forward_perm(n))
    return lax.psum(jnp.where(me == n - 1, jnp.concatenate(outs), 0.0), "pp")


def _run_unrolled(g, w1, w2, x, mesh, finished):
    local = lambda *a: _unrolled_local(*a, finished)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P("pp"), P("pp"), P("pp"), P()),
                         out_specs=P())(g, w1, w2, x)


def stages_unrolled(g, w1, w2, x, mesh):
    return _run_unrolled(g, w1, w2, x, mesh, _finished)


def stages_unrolled_one_late(g, w1, w2, x, mesh):
    return _run_unrolled(g, w1, w2, x, mesh, _finished_one_late)
