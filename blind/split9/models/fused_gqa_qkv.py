"""Llama-style fused QKV projection for grouped-query attention: one [D, (H + 2 KV) * hd] weight,
columns laid out [q heads | k heads | v heads]. For tensor parallelism the fused weight is
regrouped (outside the shard_map) so that each contiguous column shard holds its own q heads
followed by its own k and v heads.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

D, H, KV, HD, TP = 16, 8, 2, 4, 2
REP = H // KV


def fused_args():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(2, 5, D), f(D, (H + 2 * KV) * HD), f(H * HD, D)


def _attend(q, k, v):
    """q [b, s, hq, hd]; k, v [b, s, hkv, hd] with hq = REP * hkv."""
    k, v = jnp.repeat(k, REP, axis=2), jnp.repeat(v, REP, axis=2)
    s = q.shape[1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HD ** -0.5
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)


def _project(x, w, n_q, n_kv):
    b, s, _ = x.shape
    q, k, v = jnp.split(x @ w, [n_q * HD, (n_q + n_kv) * HD], axis=-1)
    return q.reshape(b, s, n_q, HD), k.reshape(b, s, n_kv, HD), v.reshape(b, s, n_kv, HD)


def gqa_fused(x, w_qkv, w_o):
    o = _attend(*_project(x, w_qkv, H, KV))
    return o.reshape(*x.shape[:2], -1) @ w_o


def _regroup_for_tp(w_qkv):
    q, k, v = jnp.split(w_qkv, [H * HD, (H + KV) * HD], axis=1)
    per_shard = lambda t: t.reshape(D, TP, -1)
    return jnp.concatenate([per_shard(q), per_shard(k), per_shard(v)], axis=2).reshape(D, -1)


def gqa_fused_tp(x, w_qkv, w_o, mesh):
    def shard(x, w_local, w_o_local):
        o = _attend(*_project(x, w_local, H // TP, KV // TP))
        return jax.lax.psum(o.reshape(*x.shape[:2], -1) @ w_o_local, "tp")

    fn = jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())
    return fn(x, _regroup_for_tp(w_qkv), w_o)
