"""Fully sharded data parallel steps (parameters and momentum sharded by rows over `fsdp`).

- `fsdp_padded` on {fsdp: 4}: the first weight has 10 rows, not a multiple of 4; the wrapper pads
  every row count up to a multiple of the axis size at the end, the shards are all-gathered and
  the padding cut off before use, gradients are re-padded and reduce-scattered, and the padding
  is removed from the outputs. Momentum SGD. Returns ((params, momentum), loss);
- `fsdp_clipped` on {dp: 2, fsdp: 2}: gradient clipping by the global norm (the squared norms of
  every gradient shard summed over fsdp), then momentum SGD. Returns ((params, momentum),
  (loss, global grad norm before clipping)).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, DI, DH, DO = 16, 10, 16, 6
MU, LR, MAX_NORM = 0.9, 0.1, 0.5


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(DI, DH), "w2": f(DH, DO)}
    return params, params, f(N, DI), f(N, DO)


def _loss(p, xb, yb):
    return jnp.mean(jnp.square(jnp.tanh(xb @ p["w1"]) @ p["w2"] - yb))


def _momentum(p, m, g):
    m = MU * m + g
    return p - LR * m, m


def _apply(params, mom, g):
    out = {k: _momentum(params[k], mom[k], g[k]) for k in params}
    return {k: out[k][0] for k in out}, {k: out[k][1] for k in out}


def sgd_step(params, mom, xb, yb):
    loss, g = jax.value_and_grad(_loss)(params, xb, yb)
    return _apply(params, mom, g), loss


def _global_norm(g):
    return jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(g)))


def clipped_step(params, mom, xb, yb):
    loss, g = jax.value_and_grad(_loss)(params, xb, yb)
    norm = _global_norm(g)
    scale = jnp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    g = jax.tree_util.tree_map(lambda a: a * scale, g)
    return _apply(params, mom, g), (loss, norm)


# ---- padded shards ---------------------------------------------------------------------------

def _pad_rows(a, n):
    return jnp.pad(a, ((0, -a.shape[0] % n), (0, 0)))


def _unpad(a, rows):
    return a[:rows]


def _unpad_from_front(a, rows):
    return a[a.shape[0] - rows:]


def _padded_local(params, mom, xb, yb, unpad):
    n = lax.axis_size("fsdp")
    rows = {"w1": DI, "w2": DH}
    full = {k: unpad(lax.all_gather(v, "fsdp", tiled=True), rows[k]) for k, v in params.items()}
    loss, g = jax.value_and_grad(_loss)(full, xb, yb)
    g = {k: lax.psum_scatter(_pad_rows(v, n), "fsdp", tiled=True) / n for k, v in g.items()}
    return _apply(params, mom, g), lax.pmean(loss, "fsdp")


def _run_padded(params, mom, xb, yb, mesh, unpad):
    n = mesh.shape["fsdp"]
    pad = lambda t: jax.tree_util.tree_map(lambda a: _pad_rows(a, n), t)
    local = lambda *a: _padded_local(*a, unpad)
    (p, m), loss = jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P("fsdp"), P("fsdp"), P("fsdp"), P("fsdp")),
                                 out_specs=((P("fsdp"), P("fsdp")), P()))(pad(params), pad(mom), xb, yb)
    cut = lambda t: {k: t[k][:params[k].shape[0]] for k in t}
    return (cut(p), cut(m)), loss


def fsdp_padded(params, mom, xb, yb, mesh):
    return _run_padded(params, mom, xb, yb, mesh, _unpad)


def fsdp_padded_unpad_from_front(params, mom, xb, yb, mesh):
    return _run_padded(params, mom, xb, yb, mesh, _unpad_from_front)


# ---- global-norm clipping --------------------------------------------------------------------

def _sharded_norm(g):
    return jnp.sqrt(lax.psum(sum(jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(g)), "fsdp"))


def _shard_local_norm(g):
    return jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(g)))


def _clipped_local(params, mom, xb, yb, norm_fn):
    full = {k: lax.all_gather(v, "fsdp", tiled=True) for k, v in params.items()}
    loss, g = jax.value_and_grad(_loss)(full, xb, yb)
    n = lax.axis_size("fsdp")
    g = {k: lax.pmean(lax.psum_scatter(v, "fsdp", tiled=True) / n, "dp") for k, v in g.items()}
    norm = norm_fn(g)
    scale = jnp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    g = jax.tree_util.tree_map(lambda a: a * scale, g)
    return _apply(params, mom, g), (lax.pmean(loss, ("dp", "fsdp")), norm)


def _run_clipped(params, mom, xb, yb, mesh, norm_fn):
    local = lambda *a: _clipped_local(*a, norm_fn)
    batch = P(("dp", "fsdp"))
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P("fsdp"), P("fsdp"), batch, batch),
                         out_specs=((P("fsdp"), P("fsdp")), (P(), P())))(params, mom, xb, yb)


def fsdp_clipped(params, mom, xb, yb, mesh):
    return _run_clipped(params, mom, xb, yb, mesh, _sharded_norm)


def fsdp_clipped_shard_local_norm(params, mom, xb, yb, mesh):
    return _run_clipped(params, mom, xb, yb, mesh, _shard_local_norm)
