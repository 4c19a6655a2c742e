"""Grouped-query attention, two production layouts.

1. A Megatron "separate blocks" fused QKV kernel [D, (H + 2*KV) * HD]: all q heads, then all k heads,
   then all v heads. The sharded version keeps the fused kernel replicated and each `mp` rank cuts
   its own q, k and v column windows out of it with dynamic slices at rank-dependent offsets.
2. MLA-style low-rank KV: a replicated down-projection to a latent of rank R (lax.dot_general with
   explicit dimension numbers), then per-head up-projections for k and v; heads are sharded over
   `heads`, batch over `dp`, and the sharded version groups q heads per KV head with a reshape
   instead of repeating k/v.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, HD = 2, 8, 32, 4


def _causal_softmax_attend(q, k, v):
    """q, k, v: [B, T, heads, HD] -> [B, T, heads, HD]."""
    s = jnp.einsum("...qhd,...khd->...hqk", q, k) * (q.shape[-1] ** -0.5)
    t = q.shape[-3]
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    return jnp.einsum("...hqk,...khd->...qhd", jax.nn.softmax(s, axis=-1), v)


# ---- 1. fused [q | k | v] kernel, column windows cut per rank ----------------------------------

H1, KV1 = 8, 2


def fused_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w_qkv": f(D, (H1 + 2 * KV1) * HD), "w_o": f(H1 * HD, D)}, f(B, T, D)


def fused_attention(params, x):
    qkv = x @ params["w_qkv"]
    q, k, v = jnp.split(qkv, [H1 * HD, (H1 + KV1) * HD], axis=-1)
    q = q.reshape(B, T, H1, HD)
    k = jnp.repeat(k.reshape(B, T, KV1, HD), H1 // KV1, axis=2)
    v = jnp.repeat(v.reshape(B, T, KV1, HD), H1 // KV1, axis=2)
    return _causal_softmax_attend(q, k, v).reshape(B, T, H1 * HD) @ params["w_o"]


def _fused_local(params, x, n_ranks):
    rank = lax.axis_index("mp")
    hq, hkv = H1 // n_ranks, KV1 // n_ranks
    w = params["w_qkv"]
    w_q = lax.dynamic_slice_in_dim(w, rank * hq * HD, hq * HD, axis=1)
    w_k = lax.dynamic_slice_in_dim(w, H1 * HD + rank * hkv * HD, hkv * HD, axis=1)
    w_v = lax.dynamic_slice_in_dim(w, (H1 + KV1) * HD + rank * hkv * HD, hkv * HD, axis=1)
    q = (x @ w_q).reshape(B, T, hq, HD)
    k = jnp.repeat((x @ w_k).reshape(B, T, hkv, HD), hq // hkv, axis=2)
    v = jnp.repeat((x @ w_v).reshape(B, T, hkv, HD), hq // hkv, axis=2)
    ctx = _causal_softmax_attend(q, k, v).reshape(B, T, hq * HD)
    return lax.psum(ctx @ params["w_o"], "mp")


def _fused_local_k_stride(params, x, n_ranks):
    rank = lax.axis_index("mp")
    hq, hkv = H1 // n_ranks, KV1 // n_ranks
    w = params["w_qkv"]
    w_q = lax.dynamic_slice_in_dim(w, rank * hq * HD, hq * HD, axis=1)
    w_k = lax.dynamic_slice_in_dim(w, H1 * HD + rank * hq * HD, hkv * HD, axis=1)
    w_v = lax.dynamic_slice_in_dim(w, (H1 + KV1) * HD + rank * hkv * HD, hkv * HD, axis=1)
    q = (x @ w_q).reshape(B, T, hq, HD)
    k = jnp.repeat((x @ w_k).reshape(B, T, hkv, HD), hq // hkv, axis=2)
    v = jnp.repeat((x @ w_v).reshape(B, T, hkv, HD), hq // hkv, axis=2)
    ctx = _causal_softmax_attend(q, k, v).reshape(B, T, hq * HD)
    return lax.psum(ctx @ params["w_o"], "mp")


def _run_fused(local, params, x, mesh):
    n = mesh.shape["mp"]
    fn = jax.shard_map(lambda p, x: local(p, x, n), mesh=mesh,
                       in_specs=({"w_qkv": P(), "w_o": P("mp")}, P()), out_specs=P())
    return fn(params, x)


def fused_attention_mp(params, x, mesh):
    return _run_fused(_fused_local, params, x, mesh)


def fused_attention_mp_k_stride(params, x, mesh):
    return _run_fused(_fused_local_k_stride, params, x, mesh)


# ---- 2. MLA-style latent KV, q heads grouped per KV head ----------------------------------------

H2, KV2, R = 8, 4, 8


def latent_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w_q": f(D, H2, HD), "w_dkv": f(D, R), "w_uk": f(R, KV2, HD), "w_uv": f(R, KV2, HD),
              "w_o": f(H2, HD, D)}
    return params, f(4, T, D)


def _latent(x, w_dkv):
    # [B, T, D] x [D, R] -> [B, T, R]
    return lax.dot_general(x, w_dkv, dimension_numbers=(((2,), (0,)), ((), ())))


def latent_attention(params, x):
    q = jnp.einsum("btd,dhe->bthe", x, params["w_q"])
    c = _latent(x, params["w_dkv"])
    g = H2 // KV2
    k = jnp.repeat(jnp.einsum("btr,rhe->bthe", c, params["w_uk"]), g, axis=2)
    v = jnp.repeat(jnp.einsum("btr,rhe->bthe", c, params["w_uv"]), g, axis=2)
    return x + jnp.einsum("bthe,hed->btd", _causal_softmax_attend(q, k, v), params["w_o"])


def _grouped_local(params, x):
    b, t, _ = x.shape
    kv_local = params["w_uk"].shape[1]
    c = _latent(x, params["w_dkv"])
    k = jnp.einsum("btr,rhe->bthe", c, params["w_uk"])
    v = jnp.einsum("btr,rhe->bthe", c, params["w_uv"])
    q = jnp.einsum("btd,dhe->bthe", x, params["w_q"])
    q = q.reshape(b, t, kv_local, -1, HD)
    s = jnp.einsum("bqngd,bknd->bngqk", q, k) * HD ** -0.5
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    ctx = jnp.einsum("bngqk,bknd->bqngd", jax.nn.softmax(s, axis=-1), v)
    out = jnp.einsum("bqhe,hed->bqd", ctx.reshape(b, t, -1, HD), params["w_o"])
    return x + lax.psum(out, "heads")


def _grouped_local_group_minor(params, x):
    b, t, _ = x.shape
    kv_local = params["w_uk"].shape[1]
    c = _latent(x, params["w_dkv"])
    k = jnp.einsum("btr,rhe->bthe", c, params["w_uk"])
    v = jnp.einsum("btr,rhe->bthe", c, params["w_uv"])
    q = jnp.einsum("btd,dhe->bthe", x, params["w_q"])
    q = q.reshape(b, t, -1, kv_local, HD).swapaxes(2, 3)
    s = jnp.einsum("bqngd,bknd->bngqk", q, k) * HD ** -0.5
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    ctx = jnp.einsum("bngqk,bknd->bqngd", jax.nn.softmax(s, axis=-1), v)
    out = jnp.einsum("bqhe,hed->bqd", ctx.reshape(b, t, -1, HD), params["w_o"])
    return x + lax.psum(out, "heads")


_LATENT_SPECS = {"w_q": P(None, "heads"), "w_dkv": P(), "w_uk": P(None, "heads"),
                 "w_uv": P(None, "heads"), "w_o": P("heads")}


def latent_attention_sharded(params, x, mesh):
    fn = jax.shard_map(_grouped_local, mesh=mesh, in_specs=(_LATENT_SPECS, P("dp")),
                       out_specs=P("dp"))
    return fn(params, x)


def latent_attention_sharded_group_minor(params, x, mesh):
    fn = jax.shard_map(_grouped_local_group_minor, mesh=mesh, in_specs=(_LATENT_SPECS, P("dp")),
                       out_specs=P("dp"))
    return fn(params, x)
