"""One sharpness-aware minimisation (SAM) step of a 2-layer tanh MLP regressor (mean squared error):
g = grad L(w); e = RHO * g / ||g|| (global norm over the parameter tree); w <- w - LR * grad L(w + e).
Returns (new params, loss at w). Parameters are a nested dict handled with `jax.tree_util`.

`sam_dp` on {dp: 4}: params replicated, batch over dp; both gradients are `pmean`-ed over dp (the
perturbation uses the global-batch gradient, as the reference does), the loss too.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, F = 16, 8, 16
LR, RHO = 0.1, 0.5


def sam_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"hidden": {"kernel": f(D, F), "bias": f(F)}, "out": {"kernel": f(F, 1), "bias": f(1)}}
    return params, f(B, D), f(B, 1)


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["hidden"]["kernel"] + params["hidden"]["bias"])
    pred = h @ params["out"]["kernel"] + params["out"]["bias"]
    return jnp.mean((pred - y) ** 2)


def _global_norm(tree):
    return jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(tree)))


def _ascent(params, g):
    scale = RHO / (_global_norm(g) + 1e-12)
    return jax.tree_util.tree_map(lambda w, gi: w + scale * gi, params, g)


def sam_step(params, x, y):
    loss, g = jax.value_and_grad(loss_fn)(params, x, y)
    g_sam = jax.grad(loss_fn)(_ascent(params, g), x, y)
    return jax.tree_util.tree_map(lambda w, gi: w - LR * gi, params, g_sam), loss


def sam_dp(params, x, y, mesh):
    def local(params, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        g = lax.pmean(g, "dp")
        g_sam = lax.pmean(jax.grad(loss_fn)(_ascent(params, g), x, y), "dp")
        new = jax.tree_util.tree_map(lambda w, gi: w - LR * gi, params, g_sam)
        return new, lax.pmean(loss, "dp")
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=(P(), P()),
                         check_vma=False)(params, x, y)


def sam_dp_local_perturbation(params, x, y, mesh):
    def local(params, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        g_sam = lax.pmean(jax.grad(loss_fn)(_ascent(params, g), x, y), "dp")
        new = jax.tree_util.tree_map(lambda w, gi: w - LR * gi, params, g_sam)
        return new, lax.pmean(loss, "dp")
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=(P(), P()),
                         check_vma=False)(params, x, y)
