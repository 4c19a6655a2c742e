"""Hybrid-sharded data parallel (HSDP) AdaBelief step for a two-layer softmax classifier: the
parameters and both optimizer moments are sharded over `fsdp` inside a replica group and
replicated over `replica`; the batch is split over both axes. Each device all-gathers the weights,
takes gradients of its batch's cross-entropy, reduce-scatters them over fsdp and averages them
over replica, and updates only its shard. Returns ((params, m, s_root), loss).

- `step_hsdp_rows`: {replica: 2, fsdp: 2}, weights sharded by rows (axis 0);
- `step_hsdp_cols`: {replica: 2, fsdp: 4}, weights sharded by columns (axis 1), reduce-scatter on
  axis 1, the psum over replica divided by the total device count.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, C = 16, 8, 16, 8
LR, B1, B2, EPS, STEP = 0.1, 0.9, 0.999, 1e-8, 10


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D, F), "w2": f(F, C)}
    return params, params, params, f(N, D), jax.ShapeDtypeStruct((N,), jnp.int32)


def xent(params, xb, labels):
    logits = jnp.tanh(xb @ params["w1"]) @ params["w2"]
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], -1))


def _adabelief(p, m, s_root, g):
    m = B1 * m + (1 - B1) * g
    s = B2 * s_root * s_root + (1 - B2) * (g - m) ** 2 + EPS
    mhat, shat = m / (1 - B1 ** STEP), s / (1 - B2 ** STEP)
    return p - LR * mhat / (jnp.sqrt(shat) + EPS), m, jnp.sqrt(s)


def _apply(params, m, s_root, g):
    out = jax.tree_util.tree_map(_adabelief, params, m, s_root, g)
    pick = lambda i: jax.tree_util.tree_map(lambda t: t[i], out, is_leaf=lambda t: isinstance(t, tuple))
    return pick(0), pick(1), pick(2)


def step(params, m, s_root, xb, labels):
    loss, g = jax.value_and_grad(xent)(params, xb, labels)
    return _apply(params, m, s_root, g), loss


BATCH = P(("replica", "fsdp"))


def _hsdp_local(params, m, s_root, xb, labels, axis, reduce_grad):
    full = jax.tree_util.tree_map(lambda a: lax.all_gather(a, "fsdp", axis=axis, tiled=True), params)
    loss, g = jax.value_and_grad(xent)(full, xb, labels)
    g = jax.tree_util.tree_map(lambda a: reduce_grad(a, axis), g)
    return _apply(params, m, s_root, g), lax.pmean(loss, ("replica", "fsdp"))


def _run(params, m, s_root, xb, labels, mesh, axis, reduce_grad):
    spec = P("fsdp") if axis == 0 else P(None, "fsdp")
    local = lambda *a: _hsdp_local(*a, axis, reduce_grad)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, BATCH, BATCH),
                         out_specs=((spec, spec, spec), P()), check_vma=False)(params, m, s_root, xb, labels)


# ---- rows: mean within the group, then mean over replicas ---------------------------------------

def _reduce_rows(g, axis):
    g = lax.psum_scatter(g, "fsdp", scatter_dimension=axis, tiled=True) / lax.axis_size("fsdp")
    return lax.pmean(g, "replica")


def _reduce_rows_group_only(g, axis):
    return lax.psum_scatter(g, "fsdp", scatter_dimension=axis, tiled=True) / lax.axis_size("fsdp")


def step_hsdp_rows(params, m, s_root, xb, labels, mesh):
    return _run(params, m, s_root, xb, labels, mesh, 0, _reduce_rows)


def step_hsdp_rows_no_replica_mean(params, m, s_root, xb, labels, mesh):
    return _run(params, m, s_root, xb, labels, mesh, 0, _reduce_rows_group_only)


# ---- columns: one sum over every device, divided by the device count ----------------------------

def _reduce_cols(g, axis):
    g = lax.psum(lax.psum_scatter(g, "fsdp", scatter_dimension=axis, tiled=True), "replica")
    return g / (lax.axis_size("fsdp") * lax.axis_size("replica"))


def _reduce_cols_divided_by_group(g, axis):
    g = lax.psum(lax.psum_scatter(g, "fsdp", scatter_dimension=axis, tiled=True), "replica")
    return g / lax.axis_size("fsdp")


def step_hsdp_cols(params, m, s_root, xb, labels, mesh):
    return _run(params, m, s_root, xb, labels, mesh, 1, _reduce_cols)


def step_hsdp_cols_divided_by_group(params, m, s_root, xb, labels, mesh):
    return _run(params, m, s_root, xb, labels, mesh, 1, _reduce_cols_divided_by_group)
