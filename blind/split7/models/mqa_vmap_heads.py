"""Multi-query attention (one shared K/V head) with a fused [q heads | k | v] projection.

Per-head attention is written for a single head and vmapped; tensor parallelism splits the query
heads, K and V are computed on every device.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D = 2, 8, 16
H, HD = 4, 4
QKV_COLS = H * HD + 2 * HD


def inputs():
    return (jax.ShapeDtypeStruct((B, S, D), jnp.float32),
            jax.ShapeDtypeStruct((D, QKV_COLS), jnp.float32),
            jax.ShapeDtypeStruct((H * HD, D), jnp.float32))


def one_head(q, k, v):
    """q, k, v: [S, HD] -> [S, HD], causal."""
    s = q @ k.T / math.sqrt(HD)
    causal = jnp.tril(jnp.ones((q.shape[0], k.shape[0]), bool))
    s = jnp.where(causal, s, -1e30)
    return jax.nn.softmax(s, axis=-1) @ v


# heads on axis 1 of q, shared k/v; then batch
attend = jax.vmap(jax.vmap(one_head, in_axes=(1, None, None), out_axes=1), in_axes=(0, 0, 0))


def mqa(x, w_qkv, w_o):
    proj = x @ w_qkv
    q = proj[..., : H * HD].reshape(B, S, H, HD)
    k = proj[..., H * HD: H * HD + HD]
    v = proj[..., H * HD + HD:]
    o = attend(q, k, v)
    return o.reshape(B, S, H * HD) @ w_o


def _mqa_tp(x, w_qkv, w_o, k_start_fn, mesh):
    n = mesh.shape["tp"]
    heads = H // n

    def shard_fn(x, w_qkv, w_o_rows):
        dev = lax.axis_index("tp")
        wq = lax.dynamic_slice_in_dim(w_qkv, dev * heads * HD, heads * HD, axis=1)
        wk = lax.dynamic_slice_in_dim(w_qkv, k_start_fn(dev), HD, axis=1)
        wv = w_qkv[:, H * HD + HD:]
        q = (x @ wq).reshape(B, S, heads, HD)
        o = attend(q, x @ wk, x @ wv).reshape(B, S, heads * HD)
        return lax.psum(o @ w_o_rows, "tp")

    return jax.shard_map(shard_fn, mesh=mesh, in_specs=(P(), P(), P("tp", None)),
                         out_specs=P())(x, w_qkv, w_o)


def mqa_tp(x, w_qkv, w_o, mesh):
    return _mqa_tp(x, w_qkv, w_o, lambda dev: H * HD, mesh)


def mqa_tp_kslice(x, w_qkv, w_o, mesh):
    return _mqa_tp(x, w_qkv, w_o, lambda dev: H * HD + dev * HD, mesh)
