"""Pipeline parallelism written without scan over microbatches.

1. GPipe with the schedule unrolled in Python: 4 stages on {stage: 4}, 4 microbatches; at tick t
   stage 0 takes microbatch t, every stage runs its residual tanh-MLP, the last stage records
   microbatch t - (S - 1), and activations move one stage forward with ppermute.
2. Circular (interleaved) pipeline over {pp: 2} with 6 layers: rank r holds layers r, r + 2, r + 4
   (the [L, ...] stack is regrouped [rounds, ranks] -> [ranks, rounds] before sharding); a lax.scan
   over the 6 ticks lets the active rank apply its layer and passes the activation around the ring.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

S, M, MB, D, F = 4, 4, 2, 16, 32


def gpipe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w_in": f(S, D, F), "w_out": f(S, F, D)}, f(M * MB, D)


def _stage(x, w_in, w_out):
    return x + jnp.tanh(x @ w_in) @ w_out


def gpipe_reference(params, x):
    for s in range(S):
        x = _stage(x, params["w_in"][s], params["w_out"][s])
    return x


def _gpipe_local(params, x, perm):
    me = lax.axis_index("stage")
    w_in, w_out = params["w_in"][0], params["w_out"][0]
    micro = x.reshape(M, MB, D)
    act = jnp.zeros((MB, D))
    outs = jnp.zeros((M, MB, D))
    for tick in range(M + S - 1):
        feed = micro[tick] if tick < M else jnp.zeros((MB, D))
        act = _stage(jnp.where(me == 0, feed, act), w_in, w_out)
        done = tick - (S - 1)
        if 0 <= done < M:
            outs = outs.at[done].set(jnp.where(me == S - 1, act, 0.0))
        act = lax.ppermute(act, "stage", perm=perm)
    return lax.psum(outs, "stage").reshape(M * MB, D)


def gpipe_sharded(params, x, mesh):
    ring = [(i, (i + 1) % S) for i in range(S)]
    body = lambda p, x: _gpipe_local(p, x, ring)
    return jax.shard_map(body, mesh=mesh, in_specs=(P("stage"), P()), out_specs=P())(params, x)


def gpipe_sharded_ring_reversed(params, x, mesh):
    ring = [((i + 1) % S, i) for i in range(S)]
    body = lambda p, x: _gpipe_local(p, x, ring)
    return jax.shard_map(body, mesh=mesh, in_specs=(P("stage"), P()), out_specs=P())(params, x)


# ---- circular pipeline ---------------------------------------------------------------------------

L, RANKS, N2 = 6, 2, 8
ROUNDS = L // RANKS


def circular_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w": f(L, D, D), "b": f(L, D)}, f(N2, D)


def _layer(x, w, b):
    return x + jax.nn.gelu(x @ w + b)


def layer_stack(params, x):
    for l in range(L):
        x = _layer(x, params["w"][l], params["b"][l])
    return x


def _circular_local(params, x):
    me = lax.axis_index("pp")
    ring = [(i, (i + 1) % RANKS) for i in range(RANKS)]

    def tick(act, t):
        w = lax.dynamic_index_in_dim(params["w"][0], t // RANKS, keepdims=False)
        b = lax.dynamic_index_in_dim(params["b"][0], t // RANKS, keepdims=False)
        act = jnp.where(me == t % RANKS, _layer(act, w, b), act)
        return lax.ppermute(act, "pp", perm=ring), None

    act, _ = lax.scan(tick, x, jnp.arange(L))
    return lax.psum(jnp.where(me == L % RANKS, act, 0.0), "pp")


def _by_rank(stack):
    return jax.tree.map(lambda a: a.reshape(ROUNDS, RANKS, *a.shape[1:]).swapaxes(0, 1), stack)


def _by_rank_no_swap(stack):
    return jax.tree.map(lambda a: a.reshape(RANKS, ROUNDS, *a.shape[1:]), stack)


def circular_sharded(params, x, mesh):
    fn = jax.shard_map(_circular_local, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P(),
                       check_vma=False)
    return fn(_by_rank(params), x)


def circular_sharded_contiguous(params, x, mesh):
    fn = jax.shard_map(_circular_local, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P(),
                       check_vma=False)
    return fn(_by_rank_no_swap(params), x)
