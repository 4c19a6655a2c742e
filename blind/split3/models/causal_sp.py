"""Causal single-head attention with the sequence split across devices: each device keeps its own
query rows and gathers every key/value row; the causal mask compares global positions."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

SEQ, DIM = 32, 16
NEG_INF = -1e9


def causal_attention(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    pos = jnp.arange(SEQ)
    allowed = pos[:, None] >= pos[None, :]
    s = jnp.where(allowed, q @ k.T / jnp.sqrt(DIM).astype(x.dtype), NEG_INF)
    return jax.nn.softmax(s, axis=-1) @ v


def causal_attention_inputs():
    f32 = jnp.float32
    mat = jax.ShapeDtypeStruct((DIM, DIM), f32)
    return jax.ShapeDtypeStruct((SEQ, DIM), f32), mat, mat, mat


def causal_attention_sp(x, wq, wk, wv, mesh):
    n = mesh.shape["sp"]
    chunk = SEQ // n

    def device_fn(xs, wq, wk, wv):
        q = xs @ wq
        k = lax.all_gather(xs @ wk, "sp", tiled=True)
        v = lax.all_gather(xs @ wv, "sp", tiled=True)
        q_pos = lax.axis_index("sp") * chunk + lax.iota(jnp.int32, chunk)
        k_pos = lax.iota(jnp.int32, SEQ)
        allowed = q_pos[:, None] >= k_pos[None, :]
        s = jnp.where(allowed, q @ k.T / jnp.sqrt(DIM).astype(xs.dtype), NEG_INF)
        return jax.nn.softmax(s, axis=-1) @ v

    return jax.shard_map(device_fn, mesh=mesh, in_specs=(P("sp"), P(), P(), P()), out_specs=P("sp"))(x, wq, wk, wv)


def causal_attention_sp_strict(x, wq, wk, wv, mesh):
    n = mesh.shape["sp"]
    chunk = SEQ // n

    def device_fn(xs, wq, wk, wv):
        q = xs @ wq
        k = lax.all_gather(xs @ wk, "sp", tiled=True)
        v = lax.all_gather(xs @ wv, "sp", tiled=True)
        q_pos = lax.axis_index("sp") * chunk + lax.iota(jnp.int32, chunk)
        k_pos = lax.iota(jnp.int32, SEQ)
        allowed = q_pos[:, None] > k_pos[None, :]
        s = jnp.where(allowed, q @ k.T / jnp.sqrt(DIM).astype(xs.dtype), NEG_INF)
        return jax.nn.softmax(s, axis=-1) @ v

    return jax.shard_map(device_fn, mesh=mesh, in_specs=(P("sp"), P(), P(), P()), out_specs=P("sp"))(x, wq, wk, wv)
