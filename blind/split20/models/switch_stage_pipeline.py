"""Two pipelines with hand-written microbatch schedules.

`stages`: four different stages (input projection + tanh, two residual GELU MLPs, final LayerNorm +
output projection), stage parameters stacked on a leading axis. `pipeline_switch` runs it on
{pp: 4}: each device picks its stage body with `lax.switch(axis_index)`, activations move to the
next stage with `ppermute` every tick of a Python loop over M + S - 1 ticks, and the last stage's
results are psum'd to every device.

`stack`: four identical residual MLP layers stacked [L, ...]. `pipeline_scan_remat` runs it on
{dp: 2, pp: 2}: the stack is reshaped to [stage, layer-in-stage, ...], each stage scans its two
layers under `jax.checkpoint`, and the tick loop is a `lax.scan`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, S, M, L = 16, 16, 32, 4, 4, 4


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(S, D, F), "b1": f(S, F), "w2": f(S, F, D), "b2": f(S, D)}, f(N, D)


def stack_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(L, D, F), "w2": f(L, F, D), "g": f(L, D)}, f(N, D)


def _in_proj(p, x):
    return jnp.tanh(x @ p["w1"][:, :D] + p["b1"][:D])


def _mlp(p, x):
    return x + jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def _head(p, x):
    mu = x.mean(-1, keepdims=True)
    h = (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    return h @ p["w2"][:D] + p["b2"]


BRANCHES = (_in_proj, _mlp, _mlp, _head)


def stages(p, x):
    for s, fn in enumerate(BRANCHES):
        x = fn(jax.tree_util.tree_map(lambda a: a[s], p), x)
    return x


def _switch_local(p, x, ticks):
    p = jax.tree_util.tree_map(lambda a: a[0], p)
    n = lax.axis_size("pp")
    stage = lax.axis_index("pp")
    micro = x.reshape(M, -1, D)
    state = jnp.zeros_like(micro[0])
    out = jnp.zeros_like(micro)
    for t in range(ticks(M, n)):
        feed = micro[t] if t < M else jnp.zeros_like(micro[0])
        state = jnp.where(stage == 0, feed, state)
        state = lax.switch(stage, BRANCHES, p, state)
        done = t - (n - 1)
        if 0 <= done < M:
            out = out.at[done].set(jnp.where(stage == n - 1, state, 0.0))
        state = lax.ppermute(state, "pp", [(i, i + 1) for i in range(n - 1)])
    return lax.psum(out, "pp").reshape(x.shape)


def _ticks(m, n):
    return m + n - 1


def _ticks_short_drain(m, n):
    return m + n - 2


def _run_switch(p, x, mesh, ticks):
    local = lambda p, x: _switch_local(p, x, ticks)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P(),
                         check_vma=False)(p, x)


def pipeline_switch(p, x, mesh):
    return _run_switch(p, x, mesh, _ticks)


def pipeline_switch_short_drain(p, x, mesh):
    return _run_switch(p, x, mesh, _ticks_short_drain)


# ---- homogeneous stack, scan schedule ------------------------------------------------------------

def _layer(x, p):
    h = x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * p["g"]
    return x + jax.nn.relu(h @ p["w1"]) @ p["w2"], None


def stack(p, x):
    return lax.scan(_layer, x, p)[0]


def _stage_major(p, n):
    return jax.tree_util.tree_map(lambda a: a.reshape(n, L // n, *a.shape[1:]), p)


def _stage_minor(p, n):
    return jax.tree_util.tree_map(lambda a: jnp.swapaxes(a.reshape(L // n, n, *a.shape[1:]), 0, 1), p)


def _scan_local(p, x):
    p = jax.tree_util.tree_map(lambda a: a[0], p)
    n = lax.axis_size("pp")
    stage = lax.axis_index("pp")
    micro = x.reshape(2, -1, D)
    m = micro.shape[0]
    body = jax.checkpoint(lambda h: lax.scan(_layer, h, p)[0])

    def tick(carry, t):
        state, out = carry
        feed = lax.dynamic_index_in_dim(micro, jnp.minimum(t, m - 1), keepdims=False)
        state = body(jnp.where(stage == 0, feed, state))
        done = t - (n - 1)
        keep = (stage == n - 1) & (done >= 0)
        out = lax.dynamic_update_index_in_dim(
            out, jnp.where(keep, state, lax.dynamic_index_in_dim(out, jnp.maximum(done, 0), keepdims=False)),
            jnp.maximum(done, 0), 0)
        state = lax.ppermute(state, "pp", [(i, i + 1) for i in range(n - 1)])
        return (state, out), None

    (_, out), _ = lax.scan(tick, (jnp.zeros_like(micro[0]), jnp.zeros_like(micro)), jnp.arange(m + n - 1))
    return lax.psum(out, "pp").reshape(x.shape)


def _run_scan(p, x, mesh, layout):
    staged = layout(p, mesh.shape["pp"])
    return jax.shard_map(_scan_local, mesh=mesh, in_specs=(P("pp"), P("dp")), out_specs=P("dp"),
                         check_vma=False)(staged, x)


def pipeline_scan_remat(p, x, mesh):
    return _run_scan(p, x, mesh, _stage_major)


def pipeline_scan_remat_layers_strided(p, x, mesh):
    return _run_scan(p, x, mesh, _stage_minor)
