"""BLOOM-style causal attention with ALiBi for a head count that is not a power of two (12 heads):
slopes are the geometric series of the closest power of two (8) followed by every other slope of the
series for twice that (the `get_alibi_slopes` recipe), bias = -slope_h * (q - k). Fused
`query_key_value` weight laid out per head ([D, H, 3, HD]), dense output [H * HD, D].

`alibi_tp` on {tp: 4}: 3 heads per device; the fused weight sharded on its head dim; every device
reads its heads' slopes from the full slope table at the global head ids
`axis_index * 3 + iota` (jnp.take); the output projection psum-reduced.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, H, HD = 2, 8, 12, 4
D = H * HD
TP = 4
H_LOCAL = H // TP


def alibi_slopes(n_heads):
    closest = 2 ** math.floor(math.log2(n_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != n_heads:
        extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** (2 * i + 1) for i in range(n_heads - closest)]
    return np.asarray(slopes, np.float32)


def alibi_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"query_key_value": f(D, H, 3, HD), "dense": f(H * HD, D)}, f(B, S, D)


def _alibi_attention(w_qkv, x, slopes):
    qkv = jnp.einsum("bsd,dhce->bshce", x, w_qkv)
    q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
    scores = jnp.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(HD)
    dist = jnp.arange(S)[:, None] - jnp.arange(S)[None, :]
    scores = scores - slopes[:, None, None] * dist
    scores = jnp.where(dist >= 0, scores, -jnp.inf)
    ctx = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(scores, axis=-1), v)
    return ctx.reshape(x.shape[0], S, -1)


def alibi_attention(p, x):
    return _alibi_attention(p["query_key_value"], x, jnp.asarray(alibi_slopes(H))) @ p["dense"]


SPECS = {"query_key_value": P(None, "tp"), "dense": P("tp", None)}


def alibi_tp(p, x, mesh):
    def local(p, x):
        heads = lax.axis_index("tp") * H_LOCAL + jnp.arange(H_LOCAL)
        slopes = jnp.take(jnp.asarray(alibi_slopes(H)), heads)
        return lax.psum(_alibi_attention(p["query_key_value"], x, slopes) @ p["dense"], "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P()), out_specs=P(), check_vma=False)(p, x)


def alibi_tp_local_slopes(p, x, mesh):
    def local(p, x):
        slopes = jnp.asarray(alibi_slopes(H_LOCAL))
        return lax.psum(_alibi_attention(p["query_key_value"], x, slopes) @ p["dense"], "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P()), out_specs=P(), check_vma=False)(p, x)
