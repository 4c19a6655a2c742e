"""Models sharded by annotations only: XLA's SPMD partitioner inserts the collectives."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, F, H, HD = 4, 8, 32, 64, 4, 8


def swiglu(params, x):
    gate = jnp.einsum("bsd,df->bsf", x, params["w_gate"])
    up = jnp.einsum("bsd,df->bsf", x, params["w_up"])
    return jnp.einsum("bsf,fd->bsd", jax.nn.silu(gate) * up, params["w_down"])


def swiglu_inputs():
    f32 = jnp.float32
    return ({"w_gate": jax.ShapeDtypeStruct((D, F), f32),
             "w_up": jax.ShapeDtypeStruct((D, F), f32),
             "w_down": jax.ShapeDtypeStruct((F, D), f32)},
            jax.ShapeDtypeStruct((B, S, D), f32))


_SWIGLU_SHARDING = ({"w_gate": P(None, "tp"), "w_up": P(None, "tp"), "w_down": P("tp", None)},
                    P("dp", None, None))


@functools.partial(jax.sharding.explicit_axes, axes=("dp", "tp"), in_sharding=_SWIGLU_SHARDING)
def _swiglu_explicit(params, x):
    gate = jnp.einsum("bsd,df->bsf", x, params["w_gate"], out_sharding=P("dp", None, "tp"))
    up = jnp.einsum("bsd,df->bsf", x, params["w_up"], out_sharding=P("dp", None, "tp"))
    hidden = jax.nn.silu(gate) * up
    out = jnp.einsum("bsf,fd->bsd", hidden, params["w_down"], out_sharding=P("dp", None, None))
    return jax.sharding.reshard(out, P())


def swiglu_explicit(params, x):
    return _swiglu_explicit(params, x)


def attention(params, x):
    q = jnp.einsum("bsd,dhk->bshk", x, params["wq"])
    k = jnp.einsum("bsd,dhk->bshk", x, params["wk"])
    v = jnp.einsum("bsd,dhk->bshk", x, params["wv"])
    w = jax.nn.softmax(jnp.einsum("bqhk,bthk->bhqt", q, k) * HD ** -0.5, axis=-1)
    ctx = jnp.einsum("bhqt,bthk->bqhk", w, v)
    return jnp.einsum("bqhk,hkd->bqd", ctx, params["wo"])


def attention_inputs():
    f32 = jnp.float32
    proj = jax.ShapeDtypeStruct((D, H, HD), f32)
    return ({"wq": proj, "wk": proj, "wv": proj, "wo": jax.ShapeDtypeStruct((H, HD, D), f32)},
            jax.ShapeDtypeStruct((B, S, D), f32))


def attention_constrained(params, x, mesh):
    by_head = NamedSharding(mesh, P(None, None, "tp", None))
    q, k, v = (jax.lax.with_sharding_constraint(jnp.einsum("bsd,dhk->bshk", x, params[n]), by_head)
               for n in ("wq", "wk", "wv"))
    w = jax.nn.softmax(jnp.einsum("bqhk,bthk->bhqt", q, k) * HD ** -0.5, axis=-1)
    w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P(None, "tp")))
    ctx = jax.lax.with_sharding_constraint(jnp.einsum("bhqt,bthk->bqhk", w, v), by_head)

    @jax.sharding.auto_axes
    def project(ctx, wo):
        return jnp.einsum("bqhk,hkd->bqd", ctx, wo)

    return project(ctx, params["wo"], out_sharding=P())


def attention_jit(params, x, mesh):
    heads = NamedSharding(mesh, P(None, "tp"))
    batch = NamedSharding(mesh, P("dp"))
    weights = {"wq": heads, "wk": heads, "wv": heads, "wo": NamedSharding(mesh, P("tp"))}

    @functools.partial(jax.jit, in_shardings=(weights, batch), out_shardings=batch)
    def fwd(p, x):
        q = jnp.einsum("bsd,dhk->bshk", x, p["wq"])
        k = jnp.einsum("bsd,dhk->bshk", x, p["wk"])
        v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
        q = q * (1.0 / jnp.sqrt(float(x.shape[-1])))
        w = jax.nn.softmax(jnp.einsum("bqhk,bthk->bhqt", q, k), axis=-1)
        ctx = jnp.einsum("bhqt,bthk->bqhk", w, v)
        ctx = jax.lax.with_sharding_constraint(ctx, NamedSharding(mesh, P("dp", None, "tp")))
        return jnp.einsum("bqhk,hkd->bqd", ctx, p["wo"])

    return fwd(params, x)
