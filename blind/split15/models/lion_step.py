"""One training step of a 2-layer GELU MLP regressor (mean squared error) with the Lion optimizer:
c = b1 * m + (1 - b1) * g; p <- p - lr * (sign(c) + wd * p) (decay on matrices only);
m <- b2 * m + (1 - b2) * g. Returns (new params, new momentum, loss). Data parallel on {dp: 4}.

- `lion_dp_pmean`: params replicated, per-device `jax.value_and_grad` of the local mean loss,
  gradients and loss averaged with `pmean`, the update applied with `jax.tree.map` over a
  hand-written decay mask;
- `lion_fsdp`: parameters (and momentum) sharded over `dp` on their first dim and all-gathered
  inside the loss, so `jax.grad` returns each device's shard of the summed per-device gradients,
  divided by the number of devices.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, O = 32, 16, 32, 8
DP = 4
LR, B1, B2, WD = 1e-2, 0.9, 0.99, 0.1
DECAY = {"w1": True, "b1": False, "w2": True}


def lion_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D, F), "b1": f(F), "w2": f(F, O)}
    return params, params, f(N, D), f(N, O)


def mse(params, x, y):
    pred = jax.nn.gelu(x @ params["w1"] + params["b1"]) @ params["w2"]
    return jnp.mean((pred - y) ** 2)


def _lion(p, m, g, decay):
    c = B1 * m + (1 - B1) * g
    p = p - LR * (jnp.sign(c) + (WD * p if decay else 0.0))
    return p, B2 * m + (1 - B2) * g


def _apply(params, moms, grads):
    out = {k: _lion(params[k], moms[k], grads[k], DECAY[k]) for k in params}
    return {k: v[0] for k, v in out.items()}, {k: v[1] for k, v in out.items()}


def lion_step(params, moms, x, y):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    new_p, new_m = _apply(params, moms, grads)
    return new_p, new_m, loss


# ---- replicated params, pmean'd gradients -----------------------------------------------------------

def _dp_local(params, moms, x, y, reduce_grads):
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    grads = reduce_grads(grads)
    new_p, new_m = _apply(params, moms, grads)
    return new_p, new_m, lax.pmean(loss, "dp")


def _averaged(grads):
    return lax.pmean(grads, "dp")


def _not_averaged(grads):
    return grads


def _dp(reduce_grads, params, moms, x, y, mesh):
    return jax.shard_map(lambda p, m, x, y: _dp_local(p, m, x, y, reduce_grads), mesh=mesh,
                         in_specs=(P(), P(), P("dp"), P("dp")), out_specs=(P(), P(), P()),
                         check_vma=False)(params, moms, x, y)


def lion_dp_pmean(params, moms, x, y, mesh):
    return _dp(_averaged, params, moms, x, y, mesh)


def lion_dp_no_pmean(params, moms, x, y, mesh):
    return _dp(_not_averaged, params, moms, x, y, mesh)


# ---- FSDP: gather inside the loss --------------------------------------------------------------------

SHARDED = {"w1": P("dp"), "b1": P("dp"), "w2": P("dp")}


def _gathered_mse(shards, x, y):
    full = {k: lax.all_gather(v, "dp", axis=0, tiled=True) for k, v in shards.items()}
    return mse(full, x, y)


def _fsdp_local(shards, moms, x, y, n_dev):
    loss, grads = jax.value_and_grad(_gathered_mse)(shards, x, y)
    grads = jax.tree.map(lambda g: g / n_dev, grads)
    new_p, new_m = _apply(shards, moms, grads)
    return new_p, new_m, lax.pmean(loss, "dp")


def _fsdp(n_dev, params, moms, x, y, mesh):
    return jax.shard_map(lambda p, m, x, y: _fsdp_local(p, m, x, y, n_dev), mesh=mesh,
                         in_specs=(SHARDED, SHARDED, P("dp"), P("dp")),
                         out_specs=(SHARDED, SHARDED, P()))(params, moms, x, y)


def lion_fsdp(params, moms, x, y, mesh):
    return _fsdp(DP, params, moms, x, y, mesh)


def lion_fsdp_sum_not_mean(params, moms, x, y, mesh):
    return _fsdp(1, params, moms, x, y, mesh)
