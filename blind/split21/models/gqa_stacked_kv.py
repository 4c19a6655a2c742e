"""Grouped-query attention (2 kv heads, 2 query heads per group, causal) whose query kernel is
grouped [D, KV, G, HD] and whose key/value kernel is one stacked tensor [D, 2, KV, HD] (k and v
along axis 1, as some checkpoints store a fused `kv_proj`).

- `gqa_kv_groups_tp`: shard_map on {tp: 2}; kv groups (with their query heads) over tp;
- `gqa_repeat_explicit`: jit-partitioned on {tp: 4} in explicit-sharding mode (an Explicit-axes
  copy of the mesh): weights `reshard`ed, every einsum states its `out_sharding`, the kv heads
  (too few to shard over 4) are projected replicated, repeated to one per query head, and
  resharded over tp.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, reshard
from jax.sharding import PartitionSpec as P

B, T, D, KV, G, HD = 2, 8, 32, 2, 2, 8
H = KV * G


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, KV, G, HD), f(D, 2, KV, HD), f(KV, G, HD, D), f(B, T, D)


def _causal_softmax(s):
    t = s.shape[-1]
    return jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e30), -1)


def gqa(w_q, w_kv, w_o, x):
    q = jnp.einsum("btd,dkgh->bkgth", x, w_q)
    kv = jnp.einsum("btd,dskh->sbkth", x, w_kv)
    k, v = kv[0], kv[1]
    p = _causal_softmax(jnp.einsum("bkgqh,bksh->bkgqs", q, k) / math.sqrt(HD))
    return jnp.einsum("bkgqs,bksh,kghd->bqd", p, v, w_o)


# ---- shard_map over kv groups -----------------------------------------------------------------

def _groups_local(w_q, w_kv, w_o, x):
    q = jnp.einsum("btd,dkgh->bkgth", x, w_q)
    kv = jnp.einsum("btd,dskh->sbkth", x, w_kv)
    k, v = kv[0], kv[1]
    p = _causal_softmax(jnp.einsum("bkgqh,bksh->bkgqs", q, k) / math.sqrt(HD))
    return lax.psum(jnp.einsum("bkgqs,bksh,kghd->bqd", p, v, w_o), "tp")


def _groups_local_k_v_swapped(w_q, w_kv, w_o, x):
    q = jnp.einsum("btd,dkgh->bkgth", x, w_q)
    kv = jnp.einsum("btd,dskh->sbkth", x, w_kv)
    v, k = kv[0], kv[1]
    p = _causal_softmax(jnp.einsum("bkgqh,bksh->bkgqs", q, k) / math.sqrt(HD))
    return lax.psum(jnp.einsum("bkgqs,bksh,kghd->bqd", p, v, w_o), "tp")


def _run_groups(local, w_q, w_kv, w_o, x, mesh):
    specs = (P(None, "tp"), P(None, None, "tp"), P("tp"), P())
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=specs, out_specs=P())(w_q, w_kv, w_o, x)


def gqa_kv_groups_tp(w_q, w_kv, w_o, x, mesh):
    return _run_groups(_groups_local, w_q, w_kv, w_o, x, mesh)


def gqa_kv_groups_tp_k_v_swapped(w_q, w_kv, w_o, x, mesh):
    return _run_groups(_groups_local_k_v_swapped, w_q, w_kv, w_o, x, mesh)


# ---- jit: kv heads expanded to one per query head -----------------------------------------------

def _expand_repeat(t):
    return jnp.repeat(t, G, axis=1)


def _expand_tile(t):
    return jnp.tile(t, (1, G, 1, 1))


def _explicit_mesh(mesh):
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Explicit,) * len(mesh.axis_names))


def _heads_explicit(w_q, w_kv, w_o, x, mesh, expand):
    heads = P(None, "tp")
    with jax.sharding.use_abstract_mesh(_explicit_mesh(mesh).abstract_mesh):
        x = reshard(x, P())
        q = jnp.einsum("btd,dnh->bnth", x, reshard(w_q.reshape(D, H, HD), heads), out_sharding=heads)
        k = jnp.einsum("btd,dkh->bkth", x, reshard(w_kv[:, 0], P()), out_sharding=P())
        v = jnp.einsum("btd,dkh->bkth", x, reshard(w_kv[:, 1], P()), out_sharding=P())
        k, v = reshard(expand(k), heads), reshard(expand(v), heads)
        s = jnp.einsum("bnqh,bnsh->bnqs", q, k, out_sharding=heads) / math.sqrt(HD)
        o = jnp.einsum("bnqs,bnsh->bnqh", _causal_softmax(s), v, out_sharding=heads)
        return jnp.einsum("bnqh,nhd->bqd", o, reshard(w_o.reshape(H, HD, D), P("tp")), out_sharding=P())


def gqa_repeat_explicit(w_q, w_kv, w_o, x, mesh):
    return _heads_explicit(w_q, w_kv, w_o, x, mesh, _expand_repeat)


def gqa_tile_explicit(w_q, w_kv, w_o, x, mesh):
    return _heads_explicit(w_q, w_kv, w_o, x, mesh, _expand_tile)
