"""Pipeline with two layers per stage: the stage's own layer stack is applied with an inner
lax.scan, the schedule is an outer lax.scan over ticks, activations move forward with ppermute."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_STAGES, LAYERS, N_MICRO, ROWS, D = 2, 4, 3, 4, 8


def residual_layer(h, w):
    return h + jax.nn.gelu(h @ w)


def reference(weights, batch):
    """weights [LAYERS, D, D]; batch [N_MICRO * ROWS, D] -> same shape."""
    out, _ = lax.scan(lambda h, w: (residual_layer(h, w), None), batch, weights)
    return out


def _pipelined(out_slot):
    def local(stage_w, batch):
        me = lax.axis_index("stage")
        micro = batch.reshape(N_MICRO, ROWS, D)

        def run_stage(h):
            return lax.scan(lambda c, w: (residual_layer(c, w), None), h, stage_w)[0]

        def tick(carry, t):
            recv, outs = carry
            x_in = lax.dynamic_index_in_dim(micro, jnp.clip(t, 0, N_MICRO - 1), keepdims=False)
            y = run_stage(jnp.where(me == 0, x_in, recv))
            slot = out_slot(t)
            ok = (me == N_STAGES - 1) & (slot >= 0) & (slot < N_MICRO)
            outs = outs.at[jnp.clip(slot, 0, N_MICRO - 1)].add(jnp.where(ok, y, 0.0))
            nxt = lax.ppermute(y, "stage", [(i, (i + 1) % N_STAGES) for i in range(N_STAGES)])
            return (nxt, outs), None

        init = (jnp.zeros((ROWS, D)), jnp.zeros((N_MICRO, ROWS, D)))
        (_, outs), _ = lax.scan(tick, init, jnp.arange(N_MICRO + N_STAGES - 1))
        return lax.psum(outs, "stage").reshape(N_MICRO * ROWS, D)

    return jax.shard_map(local, in_specs=(P("stage"), P()), out_specs=P(), check_vma=False)


def pipelined(weights, batch):
    return _pipelined(lambda t: t - (N_STAGES - 1))(weights, batch)


def pipelined_late_slot(weights, batch):
    return _pipelined(lambda t: t - N_STAGES)(weights, batch)


def inputs():
    return (jax.ShapeDtypeStruct((LAYERS, D, D), jnp.float32),
            jax.ShapeDtypeStruct((N_MICRO * ROWS, D), jnp.float32))
