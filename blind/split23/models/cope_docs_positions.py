"""Position schemes that depend on the data.

CoPE (contextual position encoding): gates g_ij = sigmoid(q_i.k_j) on causal pairs, position
p_ij = sum_{j<=m<=i} g_im, position logits q_i.e[p] linearly interpolated between floor and ceil
of p. `cope_sp`: shard_map on {sp: 4}; query rows over sp (their global index offset by
axis_index), keys gathered, so every row's suffix sums stay local.

Packed documents: given position ids, a document starts where pos == 0; attention is causal within a
document, with a learned per-head bias at clip(pos_i - pos_j, -C, C). `docs_sp`: shard_map on
{sp: 4}; local cumsum of document starts plus the starts counted on earlier shards (all_gather of
per-shard counts, exclusive prefix), segment ids and positions of keys gathered.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD = 2, 32, 16, 2, 8
S = 4
TL = T // S
C = 4


def cope_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "pe": f(T, HD)}, f(B, T, D)


def _qkv(p, xq, xk):
    s = 1.0 / math.sqrt(D)
    q = jnp.einsum("btd,dhk->bhtk", xq, p["wq"]) * s
    k = jnp.einsum("btd,dhk->bhtk", xk, p["wk"]) * s
    v = jnp.einsum("btd,dhk->bhtk", xk, p["wv"]) * s
    return q, k, v


def _cope(p, xq, xk, causal):
    q, k, v = _qkv(p, xq, xk)
    qk = jnp.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(HD)
    g = jnp.where(causal, jax.nn.sigmoid(qk), 0.0)
    pos = jnp.clip(jnp.flip(jnp.cumsum(jnp.flip(g, -1), -1), -1), 0.0, T - 1.0)
    lo = jnp.floor(pos)
    frac = pos - lo
    pl = jnp.einsum("bhqk,nk->bhqn", q, p["pe"]) / math.sqrt(HD)
    lo_i = lo.astype(jnp.int32)
    hi_i = jnp.minimum(lo_i + 1, T - 1)
    bias = (1 - frac) * jnp.take_along_axis(pl, lo_i, -1) + frac * jnp.take_along_axis(pl, hi_i, -1)
    s = jnp.where(causal, qk + bias, -1e30)
    return jnp.einsum("bhqs,bhsk->bqhk", jax.nn.softmax(s, -1), v).reshape(xq.shape[0], -1, H * HD)


def cope(p, x):
    t = jnp.arange(T)
    return _cope(p, x, x, t[:, None] >= t[None, :])


def _cope_local(p, x, strict):
    qi = lax.axis_index("sp") * TL + jnp.arange(TL)
    ki = jnp.arange(T)
    causal = qi[:, None] > ki[None, :] if strict else qi[:, None] >= ki[None, :]
    return _cope(p, x, lax.all_gather(x, "sp", axis=1, tiled=True), causal)


def _cope_run(strict, p, x, mesh):
    return jax.shard_map(lambda p, x: _cope_local(p, x, strict), mesh=mesh, in_specs=(P(), P(None, "sp")),
                         out_specs=P(None, "sp"), check_vma=False)(p, x)


def cope_sp(p, x, mesh):
    return _cope_run(False, p, x, mesh)


def cope_sp_diagonal_masked(p, x, mesh):
    return _cope_run(True, p, x, mesh)


def docs_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return ({"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "rel": f(H, 2 * C + 1)}, f(B, T, D),
            jax.ShapeDtypeStruct((B, T), jnp.int32))


def _docs(p, xq, xk, qpos, kpos, qseg, kseg, qi, ki):
    q, k, v = _qkv(p, xq, xk)
    rel = jnp.clip(qpos[:, :, None] - kpos[:, None, :], -C, C) + C
    bias = jnp.moveaxis(p["rel"][:, rel], 0, 1)
    ok = (qseg[:, :, None] == kseg[:, None, :]) & (qi[:, None] >= ki[None, :])[None]
    s = jnp.where(ok[:, None], jnp.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(HD) + bias, -1e30)
    return jnp.einsum("bhqs,bhsk->bqhk", jax.nn.softmax(s, -1), v).reshape(xq.shape[0], -1, H * HD)


def docs(p, x, pos):
    seg = jnp.cumsum(pos == 0, axis=1)
    t = jnp.arange(T)
    return _docs(p, x, x, pos, pos, seg, seg, t, t)


def _docs_local(p, x, pos, inclusive):
    r = lax.axis_index("sp")
    starts = (pos == 0).astype(jnp.int32)
    counts = lax.all_gather(jnp.sum(starts, 1), "sp", axis=1)
    before = jnp.sum(jnp.where(jnp.arange(S) <= r if inclusive else jnp.arange(S) < r, counts, 0), 1)
    seg = jnp.cumsum(starts, 1) + before[:, None]
    gather = lambda a: lax.all_gather(a, "sp", axis=1, tiled=True)
    return _docs(p, x, gather(x), pos, gather(pos), seg, gather(seg), r * TL + jnp.arange(TL), jnp.arange(T))


def _docs_run(inclusive, p, x, pos, mesh):
    return jax.shard_map(lambda p, x, pos: _docs_local(p, x, pos, inclusive), mesh=mesh,
                         in_specs=(P(), P(None, "sp"), P(None, "sp")), out_specs=P(None, "sp"),
                         check_vma=False)(p, x, pos)


def docs_sp(p, x, pos, mesh):
    return _docs_run(False, p, x, pos, mesh)


def docs_sp_inclusive_prefix(p, x, pos, mesh):
    return _docs_run(True, p, x, pos, mesh)
