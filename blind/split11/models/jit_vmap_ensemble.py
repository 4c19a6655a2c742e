"""Programs sharded by jit alone (sharding propagation; no shard_map, no collectives written).

1. A deep ensemble of 4 LayerNorm-MLP members evaluated with jax.vmap(spmd_axis_name="ens"): the
   member function pins its activations with with_sharding_constraint (rows over `rows`, hidden
   over nothing) and the vmapped ensemble axis is placed on `ens`; the jitted entry fixes its
   output sharding. The sharded member uses a hand-fused LayerNorm (jnp.var) instead of the
   reference's sum-of-squares one.
2. Multi-head attention whose projection weights enter a nested jax.jit with in_shardings (heads
   over `heads`) and whose scores are written with lax.dot_general and explicit dimension numbers,
   batch over `batch`, inside jax.named_scope blocks.
"""
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

E, N, D, F = 4, 8, 16, 32
EPS = 1e-5


def ensemble_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"gamma": f(E, D), "beta": f(E, D), "w1": f(E, D, F), "w2": f(E, F, D)}
    return params, f(E, N, D)


def _member(p, x):
    n = x.shape[-1]
    mu = jnp.sum(x, axis=-1, keepdims=True) / n
    var = jnp.sum(x * x, axis=-1, keepdims=True) / n - mu * mu
    h = (x - mu) / jnp.sqrt(var + EPS) * p["gamma"] + p["beta"]
    return x + jax.nn.relu(h @ p["w1"]) @ p["w2"]


def ensemble(params, x):
    return jax.vmap(_member)(params, x)


def _member_sharded(p, x, mesh, stat_axis):
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("rows")))
    xc = x - x.mean(axis=stat_axis, keepdims=True)
    h = xc * lax.rsqrt(x.var(axis=-1, keepdims=True) + EPS) * p["gamma"] + p["beta"]
    h = lax.with_sharding_constraint(jax.nn.relu(h @ p["w1"]), NamedSharding(mesh, P("rows", None)))
    return x + h @ p["w2"]


def _ensemble_jit(params, x, mesh, stat_axis):
    member = partial(_member_sharded, mesh=mesh, stat_axis=stat_axis)
    run = jax.jit(jax.vmap(member, spmd_axis_name="ens"),
                  out_shardings=NamedSharding(mesh, P("ens", "rows")))
    return run(params, x)


def ensemble_sharded(params, x, mesh):
    return _ensemble_jit(params, x, mesh, stat_axis=-1)


def ensemble_sharded_row_stats(params, x, mesh):
    return _ensemble_jit(params, x, mesh, stat_axis=0)


# ---- attention with nested jit in_shardings and dot_general scores ------------------------------

B, T, H, HD = 4, 8, 4, 4
DM = H * HD


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(DM, H, HD), "wk": f(DM, H, HD), "wv": f(DM, H, HD), "wo": f(H, HD, DM)}, f(B, T, DM)


def mha(params, x):
    q, k, v = (jnp.einsum("btd,dhe->bthe", x, params[n]) for n in ("wq", "wk", "wv"))
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(jnp.float32(HD))
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    return x + jnp.einsum("bqhe,hed->bqd", o, params["wo"])


def _scores(q, k, scale):
    # q [B, T, H, E], k [B, S, H, E] -> [B, H, T, S]; batch dims (B, H), contract E
    return lax.dot_general(q, k, (((3,), (3,)), ((0, 2), (0, 2)))) * scale


def _mha_placed(mesh, scale):
    heads = NamedSharding(mesh, P(None, "heads"))
    acts = NamedSharding(mesh, P("batch", None, "heads"))

    @partial(jax.jit, in_shardings=({"wq": heads, "wk": heads, "wv": heads,
                                     "wo": NamedSharding(mesh, P("heads"))},
                                    NamedSharding(mesh, P("batch"))),
             out_shardings=NamedSharding(mesh, P("batch")))
    def run(params, x):
        with jax.named_scope("qkv"):
            q, k, v = (lax.with_sharding_constraint(jnp.einsum("...d,dhe->...he", x, params[n]), acts)
                       for n in ("wq", "wk", "wv"))
        with jax.named_scope("scores"):
            p = jax.nn.softmax(_scores(q, k, scale), axis=-1)
        with jax.named_scope("out"):
            o = lax.with_sharding_constraint(jnp.einsum("bhqk,bkhe->bqhe", p, v), acts)
            return x + jnp.einsum("...he,hed->...d", o, params["wo"])
    return run


def mha_sharded(params, x, mesh):
    return _mha_placed(mesh, HD ** -0.5)(params, x)


def mha_sharded_scale(params, x, mesh):
    return _mha_placed(mesh, HD ** 0.5)(params, x)
