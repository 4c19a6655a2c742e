"""Programs partitioned by the compiler alone: sharding constraints, nested jit with
out_shardings, no shard_map. The distributed copies were rewritten for readability."""

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

wsc = jax.lax.with_sharding_constraint

B, S, D, NH = 4, 8, 16, 4
HD = D // NH


def mlp_args():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((D, 4 * D), f),
            jax.ShapeDtypeStruct((4 * D,), f), jax.ShapeDtypeStruct((4 * D, D), f))


def swish_mlp(x, w_up, b_up, w_down):
    return jnp.dot(jax.nn.swish(jnp.dot(x, w_up) + b_up), w_down)


def swish_mlp_partitioned(x, w_up, b_up, w_down):
    x = wsc(x, P("dp", None, None))
    w_up = wsc(w_up, P(None, "tp"))
    w_down = wsc(w_down, P("tp", None))
    hidden = wsc(jax.nn.swish(jnp.dot(x, w_up) + b_up), P("dp", None, "tp"))
    return wsc(jnp.dot(hidden, w_down), P("dp", None, None))


def attn_args():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((D, D), f),
            jax.ShapeDtypeStruct((D, D), f), jax.ShapeDtypeStruct((D, D), f),
            jax.ShapeDtypeStruct((D, D), f))


def mha(x, wq, wk, wv, wo):
    def heads(t):
        return t.reshape(B, S, NH, HD).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    w = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / HD ** 0.5, axis=-1)
    return (w @ v).transpose(0, 2, 1, 3).reshape(B, S, D) @ wo


def _split_heads(t):
    return t.reshape(B, S, NH, HD)


def mha_partitioned(x, wq, wk, wv, wo, mesh):
    head_sharded = NamedSharding(mesh, P("dp", None, "tp", None))

    @partial(jax.jit, out_shardings=head_sharded)
    def project(x, w):
        return _split_heads(jnp.einsum("bsd,de->bse", x, w))

    q, k, v = project(x, wq), project(x, wk), project(x, wv)
    scores = wsc(jnp.einsum("bqhe,bkhe->bhqk", q, k) * HD ** -0.5, P("dp", "tp", None, None))
    ctx = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(scores, axis=-1), v)
    out = jnp.einsum("bqe,ed->bqd", ctx.reshape(B, S, D), wsc(wo, P("tp", None)))
    return wsc(out, NamedSharding(mesh, P("dp", None, None)))


def _split_heads_minor(t):
    return t.reshape(B, S, HD, NH).transpose(0, 1, 3, 2)


def mha_partitioned_head_order(x, wq, wk, wv, wo, mesh):
    head_sharded = NamedSharding(mesh, P("dp", None, "tp", None))

    @partial(jax.jit, out_shardings=head_sharded)
    def project(x, w):
        return _split_heads_minor(jnp.einsum("bsd,de->bse", x, w))

    q, k, v = project(x, wq), project(x, wk), project(x, wv)
    scores = wsc(jnp.einsum("bqhe,bkhe->bhqk", q, k) * HD ** -0.5, P("dp", "tp", None, None))
    ctx = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(scores, axis=-1), v)
    out = jnp.einsum("bqe,ed->bqd", ctx.reshape(B, S, D), wsc(wo, P("tp", None)))
    return wsc(out, NamedSharding(mesh, P("dp", None, None)))


def norm_args():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((D,), f))


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def rms_norm_feature_sharded(x, scale, mesh):
    """Features split over 'tp': the mean over the last dim crosses shards (the partitioner's job)."""
    x = jax.device_put(x, NamedSharding(mesh, P("dp", None, "tp")))
    scale = wsc(scale, NamedSharding(mesh, P("tp")))
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(ms + 1e-6) * scale
    return wsc(y, NamedSharding(mesh, P("dp", "tp", None)))
