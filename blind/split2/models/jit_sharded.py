"""Programs sharded by jit alone: no shard_map, XLA's SPMD partitioner inserts the collectives.

`norm_mlp_*` pin activations with with_sharding_constraint on the given (Auto) mesh; the attention
versions re-declare the mesh's axes as Explicit inside the jitted function and use reshard,
out_sharding and auto_axes, the way sharding-in-types code does.
"""

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, F, H, HD = 4, 4, 16, 32, 4, 4


def _norm(x, axis):
    mean = jnp.mean(x, axis=axis, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axis, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-6)


def norm_mlp(w1, w2, gamma, x):
    h = _norm(x, -1) * gamma
    return x + jnp.einsum("bsf,fd->bsd", jax.nn.relu(jnp.einsum("bsd,df->bsf", h, w1)), w2)


def norm_mlp_inputs():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((D, F), f32), jax.ShapeDtypeStruct((F, D), f32),
            jax.ShapeDtypeStruct((D,), f32), jax.ShapeDtypeStruct((B, S, D), f32))


def _norm_mlp_constrained(w1, w2, gamma, x, mesh, norm_axis):
    def pin(v, *spec):
        return jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P(*spec)))

    w1, w2 = pin(w1, None, "model"), pin(w2, "model", None)
    x = pin(x, "data", None, None)
    h = pin(_norm(x, norm_axis) * gamma, "data", None, None)
    hidden = pin(jax.nn.relu(h @ w1), "data", None, "model")
    return pin(x + hidden @ w2, "data", None, None)


def norm_mlp_wsc(w1, w2, gamma, x, mesh):
    return _norm_mlp_constrained(w1, w2, gamma, x, mesh, norm_axis=-1)


def norm_mlp_wsc_v2(w1, w2, gamma, x, mesh):
    return _norm_mlp_constrained(w1, w2, gamma, x, mesh, norm_axis=0)


def attention(wq, wk, wv, wo, x):
    q, k, v = (jnp.einsum("bsd,dhe->bhse", x, w) for w in (wq, wk, wv))
    probs = jax.nn.softmax(jnp.einsum("bhse,bhte->bhst", q, k) * HD ** -0.5, axis=-1)
    return jnp.einsum("bhse,hed->bsd", jnp.einsum("bhst,bhte->bhse", probs, v), wo)


def attention_inputs():
    f32 = jnp.float32
    w = jax.ShapeDtypeStruct((D, H, HD), f32)
    return w, w, w, jax.ShapeDtypeStruct((H, HD, D), f32), jax.ShapeDtypeStruct((B, S, D), f32)


def _explicit(mesh):
    return jax.sharding.AbstractMesh(tuple(mesh.shape.values()), tuple(mesh.axis_names),
                                     axis_types=(AxisType.Explicit,) * len(mesh.axis_names))


def attention_explicit(wq, wk, wv, wo, x, mesh):
    with jax.sharding.use_abstract_mesh(_explicit(mesh)):
        wq, wk, wv = (jax.sharding.reshard(w, P(None, "model", None)) for w in (wq, wk, wv))
        wo = jax.sharding.reshard(wo, P("model", None, None))
        x = jax.sharding.reshard(x, P("data", None, None))
        heads = P("data", "model", None, None)
        q, k, v = (jnp.einsum("bsd,dhe->bhse", x, w, out_sharding=heads) for w in (wq, wk, wv))
        scores = jnp.einsum("bhse,bhte->bhst", q, k, out_sharding=heads) * HD ** -0.5
        probs = jax.sharding.auto_axes(lambda s: jax.nn.softmax(s, axis=-1),
                                       out_sharding=heads)(scores)
        ctx = jnp.einsum("bhst,bhte->bhse", probs, v, out_sharding=heads)
        out = jnp.einsum("bhse,hed->bsd", ctx, wo, out_sharding=P("data", None, None))
        return jax.sharding.reshard(out, P())

