"""A 4-stage residual-MLP pipeline with a final RMSNorm, run over 4 microbatches. The reference
applies the stages in order to every microbatch.

Pipeline parallel on {stage: 4}, stage parameters stacked [4, ...] and sharded over `stage`:
- `pipeline_scan_ppermute`: GPipe schedule as a `lax.scan` over M + N - 1 ticks; stage 0 injects
  microbatch t, activations move one stage to the right by `ppermute`, the last stage writes
  result t - (N - 1) into its output buffer, which is finally broadcast by a masked `psum`;
- `pipeline_fori_pshuffle`: the same schedule in `lax.fori_loop` with the stage function under
  `jax.checkpoint(policy=nothing_saveable)`, activations moved by `lax.pshuffle`; every stage
  returns its buffer (out_specs over stage), the last stage's is indexed outside the shard_map and
  the final norm applied there.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, M, MB, D, F = 4, 4, 2, 16, 32
AXIS = "stage"


def pipe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    stages = {"w_in": f(N, D, F), "b_in": f(N, F), "w_out": f(N, F, D)}
    return stages, f(D), f(M, MB, D)


def stage_fn(w, h):
    # unit-scale kernels with the fan-in multipliers applied at use
    return h + (jax.nn.gelu(h @ w["w_in"] * D ** -0.5 + w["b_in"]) @ w["w_out"]) * F ** -0.5


def final_norm(h, scale):
    return h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * scale


def pipeline(stages, scale, xs):
    def one(x):
        for s in range(N):
            x = stage_fn(jax.tree_util.tree_map(lambda a: a[s], stages), x)
        return final_norm(x, scale)
    return jax.vmap(one)(xs)


STAGE_SPECS = {"w_in": P(AXIS), "b_in": P(AXIS), "w_out": P(AXIS)}


def _varying(x):
    return lax.pcast(x, AXIS, to="varying")


# ---- GPipe in scan with ppermute ---------------------------------------------------------------

def _scan_local(lag):
    def local(stages, scale, xs):
        w = jax.tree_util.tree_map(lambda a: a[0], stages)
        me = lax.axis_index(AXIS)

        def tick(carry, t):
            state, out = carry
            fresh = lax.dynamic_index_in_dim(xs, jnp.minimum(t, M - 1), keepdims=False)
            y = stage_fn(w, jnp.where(me == 0, fresh, state))
            slot = t - lag
            done = (me == N - 1) & (slot >= 0)
            out = jnp.where(done, lax.dynamic_update_index_in_dim(out, y, jnp.maximum(slot, 0), 0), out)
            state = lax.ppermute(y, AXIS, [(i, (i + 1) % N) for i in range(N)])
            return (state, out), None

        init = (_varying(jnp.zeros((MB, D))), _varying(jnp.zeros((M, MB, D))))
        (_, out), _ = lax.scan(tick, init, jnp.arange(M + N - 1))
        return final_norm(lax.psum(jnp.where(me == N - 1, out, 0.0), AXIS), scale)
    return local


def _run(local, stages, scale, xs, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(STAGE_SPECS, P(), P()),
                         out_specs=P())(stages, scale, xs)


def pipeline_scan_ppermute(stages, scale, xs, mesh):
    return _run(_scan_local(N - 1), stages, scale, xs, mesh)


def pipeline_scan_ppermute_slot(stages, scale, xs, mesh):
    return _run(_scan_local(N), stages, scale, xs, mesh)


# ---- GPipe in fori_loop with pshuffle ----------------------------------------------------------

_stage_remat = jax.checkpoint(stage_fn, policy=jax.checkpoint_policies.nothing_saveable)


def _schedule_fori(stages, xs):
    w = jax.tree_util.tree_map(lambda a: a[0], stages)
    me = lax.axis_index(AXIS)

    def body(t, carry):
        state, out = carry
        y = _stage_remat(w, jnp.where(me == 0, xs[jnp.minimum(t, M - 1)], state))
        slot = jnp.clip(t - (N - 1), 0, M - 1)
        keep = t >= N - 1
        out = out.at[slot].set(jnp.where(keep, y, out[slot]))
        return lax.pshuffle(y, AXIS, [(i - 1) % N for i in range(N)]), out

    init = (_varying(jnp.zeros((MB, D))), _varying(jnp.zeros((M, MB, D))))
    _, out = lax.fori_loop(0, M + N - 1, body, init)
    return out


def _fori_stacked(stages, xs, mesh):
    """Every stage returns its output buffer; only the last stage's is kept."""
    fn = jax.shard_map(lambda s, x: _schedule_fori(s, x)[None], mesh=mesh,
                       in_specs=(STAGE_SPECS, P()), out_specs=P(AXIS))
    return fn(stages, xs)[N - 1]


def pipeline_fori_pshuffle(stages, scale, xs, mesh):
    return final_norm(_fori_stacked(stages, xs, mesh), scale)


def pipeline_fori_pshuffle_no_norm(stages, scale, xs, mesh):
    return _fori_stacked(stages, xs, mesh)
