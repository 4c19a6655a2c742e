"""Megatron sequence parallelism: LayerNorm on sequence shards, all-gather before the TP MLP,
reduce-scatter after it; and a causal attention whose queries stay sequence-sharded."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BS, SEQ, DM, DFF = 2, 8, 16, 32
EPS = 1e-5


def mlp_args():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BS, SEQ, DM), f), jax.ShapeDtypeStruct((DM,), f),
            jax.ShapeDtypeStruct((DM,), f), jax.ShapeDtypeStruct((DM, DFF), f),
            jax.ShapeDtypeStruct((DFF, DM), f))


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + EPS) * g + b


def norm_mlp(x, g, b, w1, w2):
    return x + jax.nn.silu(layer_norm(x, g, b) @ w1) @ w2


def norm_mlp_sp(x, g, b, w1, w2, mesh):
    def f(x, g, b, w1, w2):
        h = layer_norm(x, g, b)
        h = lax.all_gather(h, "sp", axis=1, tiled=True)
        y = jax.nn.silu(h @ w1) @ w2
        return x + lax.psum_scatter(y, "sp", scatter_dimension=1, tiled=True)

    return jax.shard_map(f, mesh=mesh,
                         in_specs=(P(None, "sp"), P(), P(), P(None, "sp"), P("sp", None)),
                         out_specs=P(None, "sp"))(x, g, b, w1, w2)


def norm_mlp_sp_batch_dim(x, g, b, w1, w2, mesh):
    # gathers and scatters along the batch dimension although x is split along the sequence
    def f(x, g, b, w1, w2):
        h = layer_norm(x, g, b)
        h = lax.all_gather(h, "sp", axis=0, tiled=True)
        y = jax.nn.silu(h @ w1) @ w2
        return x + lax.psum_scatter(y, "sp", scatter_dimension=0, tiled=True)

    return jax.shard_map(f, mesh=mesh,
                         in_specs=(P(None, "sp"), P(), P(), P(None, "sp"), P("sp", None)),
                         out_specs=P(None, "sp"))(x, g, b, w1, w2)


NHEAD, HDIM = 2, 8


def attn_args():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BS, SEQ, DM), f), jax.ShapeDtypeStruct((DM, 3 * DM), f))


def causal_attn(x, w):
    q, k, v = jnp.split(x @ w, 3, axis=-1)
    q, k, v = (t.reshape(BS, SEQ, NHEAD, HDIM) for t in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(HDIM))
    qi = jnp.arange(SEQ)[:, None]
    ki = jnp.arange(SEQ)[None, :]
    s = jnp.where(ki <= qi, s, -jnp.inf)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return o.reshape(BS, SEQ, DM)


def _causal_attn_sp(x, w, mesh, with_offset):
    def f(x, w):
        q, k, v = jnp.split(x @ w, 3, axis=-1)
        sl = q.shape[1]
        k = lax.all_gather(k, "sp", axis=1, tiled=True)
        v = lax.all_gather(v, "sp", axis=1, tiled=True)
        q, k, v = (t.reshape(BS, t.shape[1], NHEAD, HDIM) for t in (q, k, v))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(HDIM))
        start = lax.axis_index("sp") * sl if with_offset else 0
        qi = start + lax.broadcasted_iota(jnp.int32, (sl, SEQ), 0)
        ki = lax.broadcasted_iota(jnp.int32, (sl, SEQ), 1)
        s = jnp.where(ki <= qi, s, -jnp.inf)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
        return o.reshape(BS, sl, DM)

    return jax.shard_map(f, mesh=mesh, in_specs=(P(None, "sp"), P()),
                         out_specs=P(None, "sp"))(x, w)


def causal_attn_sp(x, w, mesh):
    return _causal_attn_sp(x, w, mesh, with_offset=True)


def causal_attn_sp_local_mask(x, w, mesh):
    return _causal_attn_sp(x, w, mesh, with_offset=False)
