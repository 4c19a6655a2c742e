"""Two residual sublayers, each its own nested jax.jit with in/out shardings (batch over 'dp').

RMSNorm -> linear -> silu -> linear, twice, weights in a tuple of per-layer dicts.
"""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

N, DIM, HIDDEN, LAYERS = 8, 8, 16, 2


def inputs():
    f = jnp.float32
    layer = {"scale": jax.ShapeDtypeStruct((DIM,), f), "a": jax.ShapeDtypeStruct((DIM, HIDDEN), f),
             "b": jax.ShapeDtypeStruct((HIDDEN, DIM), f)}
    return (tuple(dict(layer) for _ in range(LAYERS)), jax.ShapeDtypeStruct((N, DIM), f))


def rms_norm(x, scale, axis=-1):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=axis, keepdims=True) + 1e-6) * scale


def sublayer(p, x):
    return x + jax.nn.silu(rms_norm(x, p["scale"]) @ p["a"]) @ p["b"]


def net(layers, x):
    for p in layers:
        x = sublayer(p, x)
    return x


def net_nested(layers, x, mesh):
    rows = NamedSharding(mesh, P("dp", None))
    rep = NamedSharding(mesh, P())
    p_shard = {"scale": rep, "a": rep, "b": rep}
    step = jax.jit(sublayer, in_shardings=(p_shard, rows), out_shardings=rows)
    for p in layers:
        x = step(p, x)
    return jax.lax.with_sharding_constraint(x, rep)


def _sublayer_batch_axis(p, x):
    h = rms_norm(x, p["scale"], axis=0)
    return x + jax.nn.silu(h @ p["a"]) @ p["b"]


def net_nested_wrong_norm_axis(layers, x, mesh):
    rows = NamedSharding(mesh, P("dp", None))
    rep = NamedSharding(mesh, P())
    p_shard = {"scale": rep, "a": rep, "b": rep}
    step = jax.jit(_sublayer_batch_axis, in_shardings=(p_shard, rows), out_shardings=rows)
    for p in layers:
        x = step(p, x)
    return jax.lax.with_sharding_constraint(x, rep)

