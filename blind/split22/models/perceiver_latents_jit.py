"""Perceiver-style latent cross-attention block: L learned latents attend to the input tokens
(multi-head, no mask), residual, pre-LN ReLU MLP, residual.

- `perceiver_jit`: jnp code under jit on {dp: 2, tp: 2} with with_sharding_constraint on the batch
  (dp) and on the heads / MLP columns (tp);
- `perceiver_explicit`: an Explicit-axes mesh; inputs and weights `reshard`ed, every einsum states
  its `out_sharding`, the layer norms run under `auto_axes`.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, auto_axes, reshard
from jax.sharding import PartitionSpec as P

B, T, L, D, H, HD, F = 4, 16, 8, 32, 4, 8, 64


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"lat": f(L, D), "wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D),
            "g": f(D), "w1": f(D, F), "w2": f(F, D)}, f(B, T, D)


def _ln(x, g):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * g


def perceiver(p, x):
    q = jnp.einsum("ld,dhk->lhk", p["lat"], p["wq"])
    k = jnp.einsum("btd,dhk->bthk", x, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", x, p["wv"])
    a = jax.nn.softmax(jnp.einsum("lhk,bthk->bhlt", q, k) / math.sqrt(HD), axis=-1)
    z = p["lat"] + jnp.einsum("bhlt,bthk,hkd->bld", a, v, p["wo"])
    return z + jax.nn.relu(_ln(z, p["g"]) @ p["w1"]) @ p["w2"]


def _jit(p, x, mesh, normalize):
    c = lambda a, *s: lax.with_sharding_constraint(a, NamedSharding(mesh, P(*s)))
    x = c(x, "dp")
    q = c(jnp.einsum("ld,dhk->lhk", p["lat"], c(p["wq"], None, "tp")), None, "tp")
    k = c(jnp.einsum("btd,dhk->bthk", x, c(p["wk"], None, "tp")), "dp", None, "tp")
    v = c(jnp.einsum("btd,dhk->bthk", x, c(p["wv"], None, "tp")), "dp", None, "tp")
    a = c(normalize(jnp.einsum("lhk,bthk->bhlt", q, k) / math.sqrt(HD)), "dp", "tp")
    z = c(p["lat"] + jnp.einsum("bhlt,bthk,hkd->bld", a, v, c(p["wo"], "tp")), "dp")
    h = c(jax.nn.relu(_ln(z, p["g"]) @ c(p["w1"], None, "tp")), "dp", None, "tp")
    return c(z + h @ c(p["w2"], "tp"), "dp")


def perceiver_jit(p, x, mesh):
    return _jit(p, x, mesh, lambda s: jax.nn.softmax(s, axis=-1))


def perceiver_jit_softmax_over_latents(p, x, mesh):
    return _jit(p, x, mesh, lambda s: jax.nn.softmax(s, axis=-2))


def _explicit(mesh):
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Explicit,) * len(mesh.axis_names))


def _explicit_block(p, x, mesh, residual):
    with jax.sharding.use_abstract_mesh(_explicit(mesh).abstract_mesh):
        x = reshard(x, P("dp"))
        lat = reshard(p["lat"], P())
        wq, wk, wv = (reshard(p[n], P(None, "tp")) for n in ("wq", "wk", "wv"))
        q = jnp.einsum("ld,dhk->lhk", lat, wq, out_sharding=P(None, "tp"))
        k = jnp.einsum("btd,dhk->bthk", x, wk, out_sharding=P("dp", None, "tp"))
        v = jnp.einsum("btd,dhk->bthk", x, wv, out_sharding=P("dp", None, "tp"))
        s = jnp.einsum("lhk,bthk->bhlt", q, k, out_sharding=P("dp", "tp")) / math.sqrt(HD)
        o = jnp.einsum("bhlt,bthk->blhk", jax.nn.softmax(s, axis=-1), v, out_sharding=P("dp", None, "tp"))
        attn = jnp.einsum("blhk,hkd->bld", o, reshard(p["wo"], P("tp")), out_sharding=P("dp"))
        z = residual(lat, attn)
        h = auto_axes(_ln, out_sharding=P("dp"))(z, reshard(p["g"], P()))
        u = jnp.einsum("bld,df->blf", h, reshard(p["w1"], P(None, "tp")), out_sharding=P("dp", None, "tp"))
        y = jnp.einsum("blf,fd->bld", jax.nn.relu(u), reshard(p["w2"], P("tp")), out_sharding=P("dp"))
        return reshard(z + y, P())


def perceiver_explicit(p, x, mesh):
    return _explicit_block(p, x, mesh, lambda lat, attn: lat + attn)


def perceiver_explicit_latent_residual_dropped(p, x, mesh):
    return _explicit_block(p, x, mesh, lambda lat, attn: attn)
