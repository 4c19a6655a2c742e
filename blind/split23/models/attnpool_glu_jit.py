"""jit-partitioned heads: programs written for the GSPMD partitioner (in_shardings, out_shardings,
with_sharding_constraint), on {dp: 2, tp: 2}.

`attnpool_jit`: CLIP-style attention pooling, a learned query per head attends over the T tokens of
every example; keys/values constrained (batch dp, heads tp). `glu_stack_jit`: two pre-RMSNorm GLU
MLP layers (silu(x W_gate) * (x W_up)) W_down, hidden constrained over tp, batch over dp.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F, L = 4, 16, 16, 4, 8, 32, 2


def pool_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"q0": f(H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H * HD, D)}, f(B, T, D)


def _pool(p, x, kv_sharding, soft_axis):
    k = jnp.einsum("btd,dhk->bthk", x, p["wk"]) / math.sqrt(D)
    v = jnp.einsum("btd,dhk->bthk", x, p["wv"]) / math.sqrt(D)
    if kv_sharding is not None:
        k, v = lax.with_sharding_constraint(k, kv_sharding), lax.with_sharding_constraint(v, kv_sharding)
    s = jnp.einsum("hk,bthk->bth", p["q0"], k) / math.sqrt(HD)
    pooled = jnp.einsum("bth,bthk->bhk", jax.nn.softmax(s, soft_axis), v)
    return pooled.reshape(x.shape[0], H * HD) @ p["wo"] / math.sqrt(H * HD)


def attnpool(p, x):
    return _pool(p, x, None, 1)


def _pool_jit(soft_axis, p, x, mesh):
    ns = lambda *spec: NamedSharding(mesh, P(*spec))
    pspec = {"q0": ns(), "wk": ns(None, "tp"), "wv": ns(None, "tp"), "wo": ns("tp")}
    fn = jax.jit(lambda p, x: _pool(p, x, ns("dp", None, "tp"), soft_axis), in_shardings=(pspec, ns("dp")),
                 out_shardings=ns("dp"))
    return fn(p, x)


def attnpool_jit(p, x, mesh):
    return _pool_jit(1, p, x, mesh)


def attnpool_jit_softmax_over_heads(p, x, mesh):
    return _pool_jit(2, p, x, mesh)


def glu_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"g": f(L, D), "wg": f(L, D, F), "wu": f(L, D, F), "wd": f(L, F, D)}, f(B, T, D)


def _glu_layer(x, g, wg, wu, wd, hidden):
    h = x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g
    a, u = hidden(h @ wg / math.sqrt(D)), hidden(h @ wu / math.sqrt(D))
    return x + (jax.nn.silu(a) * u) @ wd / math.sqrt(F)


def glu_stack(p, x):
    for i in range(L):
        x = _glu_layer(x, p["g"][i], p["wg"][i], p["wu"][i], p["wd"][i], lambda a: a)
    return x


def _glu_jit(p, x, mesh, swap):
    hid = NamedSharding(mesh, P("dp", None, "tp"))
    for i in range(L):
        wg, wu = (p["wu"][i], p["wg"][i]) if swap else (p["wg"][i], p["wu"][i])
        x = _glu_layer(x, p["g"][i], wg, wu, p["wd"][i], lambda a: lax.with_sharding_constraint(a, hid))
    return x


def _glu_run(swap, p, x, mesh):
    ns = lambda *spec: NamedSharding(mesh, P(*spec))
    pspec = {"g": ns(), "wg": ns(None, None, "tp"), "wu": ns(None, None, "tp"), "wd": ns(None, "tp")}
    return jax.jit(lambda p, x: _glu_jit(p, x, mesh, swap), in_shardings=(pspec, ns("dp")),
                   out_shardings=ns("dp"))(p, x)


def glu_stack_jit(p, x, mesh):
    return _glu_run(False, p, x, mesh)


def glu_stack_jit_gate_up_swapped(p, x, mesh):
    return _glu_run(True, p, x, mesh)
