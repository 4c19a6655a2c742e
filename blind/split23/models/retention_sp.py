"""RetNet-style multi-scale retention (parallel form): o_i = sum_{j<=i} gamma_h^(i-j) (q_i.k_j) v_j with
a fixed per-head decay gamma_h = 1 - 2^(-5-h).

`retention_sp_gather`: shard_map on {sp: 4}; query rows over sp at positions offset by axis_index,
k and v all_gathered. `retention_sp_ulysses`: shard_map on {sp: 4}; projections on local rows, an
all_to_all swaps the sequence shard for a head shard, each rank applies its heads' decays (cut at
axis_index * HL), a second all_to_all swaps back.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD = 2, 32, 16, 4, 8
S = 4
TL, HL = T // S, H // S
GAMMA = (1.0 - 2.0 ** (-5.0 - np.arange(H))).astype(np.float32)


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}, f(B, T, D)


def _proj(p, x):
    s = 1.0 / math.sqrt(D)
    return tuple(jnp.einsum("btd,dhk->bthk", x, p[n]) * s for n in ("wq", "wk", "wv"))


def _retain(q, k, v, qpos, kpos, gamma):
    dist = (qpos[:, None] - kpos[None, :]).astype(jnp.float32)
    decay = jnp.where(dist >= 0, gamma[:, None, None] ** jnp.maximum(dist, 0.0), 0.0)
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(HD) * decay
    return jnp.einsum("bhqs,bshk->bqhk", s, v)


def _out(p, o):
    return jnp.einsum("bthk,hkd->btd", o, p["wo"]) / math.sqrt(H * HD)


def retention(p, x):
    q, k, v = _proj(p, x)
    pos = jnp.arange(T)
    return _out(p, _retain(q, k, v, pos, pos, GAMMA))


def _gather_local(p, x, offset):
    q, k, v = _proj(p, x)
    k = lax.all_gather(k, "sp", axis=1, tiled=True)
    v = lax.all_gather(v, "sp", axis=1, tiled=True)
    qpos = offset * TL + jnp.arange(TL)
    return _out(p, _retain(q, k, v, qpos, jnp.arange(T), GAMMA))


def _run(fn, p, x, mesh):
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(None, "sp")), out_specs=P(None, "sp"),
                         check_vma=False)(p, x)


def retention_sp_gather(p, x, mesh):
    return _run(lambda p, x: _gather_local(p, x, lax.axis_index("sp")), p, x, mesh)


def retention_sp_gather_queries_at_zero(p, x, mesh):
    return _run(lambda p, x: _gather_local(p, x, 0), p, x, mesh)


def _ulysses_local(p, x, gamma_start):
    q, k, v = (lax.all_to_all(a, "sp", 2, 1, tiled=True) for a in _proj(p, x))
    gamma = lax.dynamic_slice_in_dim(GAMMA, gamma_start(lax.axis_index("sp")), HL)
    pos = jnp.arange(T)
    o = lax.all_to_all(_retain(q, k, v, pos, pos, gamma), "sp", 1, 2, tiled=True)
    return _out(p, o)


def retention_sp_ulysses(p, x, mesh):
    return _run(lambda p, x: _ulysses_local(p, x, lambda r: r * HL), p, x, mesh)


def retention_sp_ulysses_first_decays(p, x, mesh):
    return _run(lambda p, x: _ulysses_local(p, x, lambda r: 0), p, x, mesh)
