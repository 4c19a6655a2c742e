"""Fully-sharded data parallelism, two forms.

1. `mlp_3d` on the 3-D mesh {data: 2, fsdp: 2, tensor: 2}: a pre-LN residual GELU MLP
   (x + gelu(ln(x) @ w1 + b1) @ w2 + b2); the batch over (data, fsdp); w1 stored P("fsdp", "tensor")
   and w2 P("tensor", "fsdp"): each weight is all-gathered over fsdp on its non-tensor dim just
   before use, the row-parallel output psum-reduced over tensor.
2. `rmsprop_fsdp` on {fsdp: 4}: one RMSprop training step (state kept as the RMS r = sqrt(v):
   v = RHO * r^2 + (1 - RHO) * g^2, w <- w - LR * g / (sqrt(v) + EPS)) of a 2-layer tanh MLP
   regressor; params and r row-sharded over fsdp, batch over fsdp; the weights are all-gathered
   inside the differentiated loss, so the gradient comes back reduce-scattered (summed over the
   devices' local-mean losses) and is divided by the device count. Returns (params, r, loss).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, F = 8, 16, 32
EPS_LN = 1e-5
LR, RHO, EPS = 0.01, 0.9, 1e-8
N_FSDP = 4


def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"ln_g": f(D), "ln_b": f(D), "w1": f(D, F), "b1": f(F), "w2": f(F, D), "b2": f(D)}, f(B, D)


def _ln(x, g, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS_LN) * g + b


def mlp(p, x):
    return x + jax.nn.gelu(_ln(x, p["ln_g"], p["ln_b"]) @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


SPECS_3D = {"ln_g": P(), "ln_b": P(), "w1": P("fsdp", "tensor"), "b1": P("tensor"),
            "w2": P("tensor", "fsdp"), "b2": P()}


def mlp_3d(p, x, mesh):
    def local(p, x):
        w1 = lax.all_gather(p["w1"], "fsdp", axis=0, tiled=True)
        w2 = lax.all_gather(p["w2"], "fsdp", axis=1, tiled=True)
        h = jax.nn.gelu(_ln(x, p["ln_g"], p["ln_b"]) @ w1 + p["b1"])
        return x + lax.psum(h @ w2, "tensor") + p["b2"]
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS_3D, P(("data", "fsdp"))),
                         out_specs=P(("data", "fsdp")), check_vma=False)(p, x)


def mlp_3d_gather_wrong_axis(p, x, mesh):
    def local(p, x):
        w1 = lax.all_gather(p["w1"], "fsdp", axis=0, tiled=True)
        w2 = lax.all_gather(p["w2"], "data", axis=1, tiled=True)
        h = jax.nn.gelu(_ln(x, p["ln_g"], p["ln_b"]) @ w1 + p["b1"])
        return x + lax.psum(h @ w2, "tensor") + p["b2"]
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS_3D, P(("data", "fsdp"))),
                         out_specs=P(("data", "fsdp")), check_vma=False)(p, x)


# ---- RMSprop step under FSDP --------------------------------------------------------------------------

def step_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D, F), "w2": f(F, 1)}
    return params, {"w1": f(D, F), "w2": f(F, 1)}, f(B, D), f(B, 1)


def _loss(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)


def _rmsprop(w, r, g):
    v = RHO * r * r + (1 - RHO) * g * g
    return w - LR * g / (jnp.sqrt(v) + EPS), jnp.sqrt(v)


def _apply(params, rms, g):
    pairs = jax.tree_util.tree_map(_rmsprop, params, rms, g)
    is_pair = lambda t: isinstance(t, tuple)
    return (jax.tree_util.tree_map(lambda t: t[0], pairs, is_leaf=is_pair),
            jax.tree_util.tree_map(lambda t: t[1], pairs, is_leaf=is_pair))


def rmsprop_step(params, rms, x, y):
    loss, g = jax.value_and_grad(_loss)(params, x, y)
    params, rms = _apply(params, rms, g)
    return params, rms, loss


def _gathered_loss(shards, x, y):
    full = jax.tree_util.tree_map(lambda s: lax.all_gather(s, "fsdp", axis=0, tiled=True), shards)
    return _loss(full, x, y)


def rmsprop_fsdp(params, rms, x, y, mesh):
    def local(params, rms, x, y):
        loss, g = jax.value_and_grad(_gathered_loss)(params, x, y)
        g = jax.tree_util.tree_map(lambda gi: gi / N_FSDP, g)
        params, rms = _apply(params, rms, g)
        return params, rms, lax.pmean(loss, "fsdp")
    return jax.shard_map(local, mesh=mesh, in_specs=(P("fsdp"), P("fsdp"), P("fsdp"), P("fsdp")),
                         out_specs=(P("fsdp"), P("fsdp"), P()), check_vma=False)(params, rms, x, y)


def rmsprop_fsdp_summed_grads(params, rms, x, y, mesh):
    def local(params, rms, x, y):
        loss, g = jax.value_and_grad(_gathered_loss)(params, x, y)
        params, rms = _apply(params, rms, g)
        return params, rms, lax.pmean(loss, "fsdp")
    return jax.shard_map(local, mesh=mesh, in_specs=(P("fsdp"), P("fsdp"), P("fsdp"), P("fsdp")),
                         out_specs=(P("fsdp"), P("fsdp"), P()), check_vma=False)(params, rms, x, y)
