"""Four residual GELU MLP stages (one per pipeline rank) on a 2-D mesh {pp: 4, tp: 2}: the stacked
stage weights [4, D, F] / [4, F, D] are sharded over pp on the stage axis and over tp on the hidden
axis (Megatron column / row split inside every stage, one psum over tp per stage).

- `pipeline_gpipe_fori`: GPipe over 4 microbatches in a `lax.fori_loop` of M + P - 1 ticks; rank 0
  reads microbatch t, activations move forward by a non-cyclic `ppermute`, the last rank writes
  its result at slot t - (P - 1) with `dynamic_update_index_in_dim`, and a psum over pp hands the
  output buffer to every rank;
- `pipeline_ring_rounds`: no microbatching: P rounds of a cyclic `ppermute`, every rank runs its
  (checkpointed, `dots_saveable`) stage every round, and after P rounds the full result is back on
  rank 0, picked with a masked psum.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

PP, M, MB, D, F = 4, 4, 4, 16, 32


def pp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(PP, D, F), "b1": f(PP, F), "w2": f(PP, F, D)}, f(M * MB, D)


def pipeline_ref(params, x):
    for s in range(PP):
        x = x + jax.nn.gelu(x @ params["w1"][s] + params["b1"][s]) @ params["w2"][s]
    return x


SPECS = ({"w1": P("pp", None, "tp"), "b1": P("pp", "tp"), "w2": P("pp", "tp")}, P())


def tp_stage(p, h):
    return h + lax.psum(jax.nn.gelu(h @ p["w1"][0] + p["b1"][0]) @ p["w2"][0], "tp")


# ---- GPipe in fori_loop -------------------------------------------------------------------------

def _gpipe_local(ticks):
    def local(p, x):
        rank = lax.axis_index("pp")
        mbs = x.reshape(M, MB, D)

        def tick(t, carry):
            h, out = carry
            h = jnp.where(rank == 0, lax.dynamic_index_in_dim(mbs, jnp.minimum(t, M - 1), 0, False), h)
            y = tp_stage(p, h)
            slot = jnp.clip(t - (PP - 1), 0, M - 1)
            done = (rank == PP - 1) & (t >= PP - 1)
            out = jnp.where(done, lax.dynamic_update_index_in_dim(out, y, slot, 0), out)
            return lax.ppermute(y, "pp", [(i, i + 1) for i in range(PP - 1)]), out

        init = (jnp.zeros((MB, D), x.dtype), jnp.zeros((M, MB, D), x.dtype))
        _, out = lax.fori_loop(0, ticks, tick, init)
        return lax.psum(out, "pp").reshape(M * MB, D)
    return local


def pipeline_gpipe_fori(params, x, mesh):
    return jax.shard_map(_gpipe_local(M + PP - 1), mesh=mesh, in_specs=SPECS, out_specs=P(),
                         check_vma=False)(params, x)


def pipeline_gpipe_fori_short(params, x, mesh):
    return jax.shard_map(_gpipe_local(M + PP - 2), mesh=mesh, in_specs=SPECS, out_specs=P(),
                         check_vma=False)(params, x)


# ---- P rounds of a ring -------------------------------------------------------------------------

def _ring_local(final_rank):
    stage = jax.checkpoint(tp_stage, policy=jax.checkpoint_policies.dots_saveable)

    def local(p, x):
        h = x
        for _ in range(PP):
            h = lax.ppermute(stage(p, h), "pp", [(i, (i + 1) % PP) for i in range(PP)])
        keep = lax.axis_index("pp") == final_rank
        return lax.psum(jnp.where(keep, h, 0.0), "pp")
    return local


def pipeline_ring_rounds(params, x, mesh):
    return jax.shard_map(_ring_local(0), mesh=mesh, in_specs=SPECS, out_specs=P())(params, x)


def pipeline_ring_rounds_last_rank(params, x, mesh):
    return jax.shard_map(_ring_local(PP - 1), mesh=mesh, in_specs=SPECS, out_specs=P())(params, x)
