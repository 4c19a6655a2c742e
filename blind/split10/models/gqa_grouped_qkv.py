"""GQA self-attention with a fused, group-major QKV kernel (as in several HF/GLM checkpoints).

The fused kernel's columns are laid out per KV group: [q_0 .. q_{G-1}, k, v] for group 0, then
group 1, ... Parameters are nested flax-linen-style dicts: params["self_attn"]["qkv_proj"]["kernel"].
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, HKV, G, HD = 2, 8, 32, 2, 2, 8
H = HKV * G


def attn_inputs():
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    params = {"self_attn": {"qkv_proj": {"kernel": s(D, HKV * (G + 2) * HD)},
                            "o_proj": {"kernel": s(H * HD, D)}}}
    return params, s(B, T, D)


def _causal_softmax(scores):
    t = scores.shape[-1]
    keep = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    return jax.nn.softmax(jnp.where(keep, scores, -1e30), axis=-1)


def self_attention(params, x):
    p = params["self_attn"]
    qkv = (x @ p["qkv_proj"]["kernel"]).reshape(B, T, HKV, G + 2, HD)
    q, k, v = qkv[..., :G, :], qkv[..., G, :], qkv[..., G + 1, :]
    scores = jnp.einsum("bqngd,bknd->bngqk", q, k) * HD ** -0.5
    ctx = jnp.einsum("bngqk,bknd->bqngd", _causal_softmax(scores), v)
    return ctx.reshape(B, T, H * HD) @ p["o_proj"]["kernel"]


# ---- column-parallel fused kernel: each mp shard holds whole KV groups ---------------------------

def _local_groups(params, x):
    p = params["self_attn"]
    slab = (x @ p["qkv_proj"]["kernel"]).reshape(B, T, -1, G + 2, HD)
    q = slab[..., :G, :]
    k = slab[..., G, :]
    v = slab[..., G + 1, :]
    scores = jnp.einsum("bqngd,bknd->bngqk", q, k) * HD ** -0.5
    ctx = jnp.einsum("bngqk,bknd->bqngd", _causal_softmax(scores), v)
    return lax.psum(ctx.reshape(B, T, -1) @ p["o_proj"]["kernel"], "mp")


def _local_groups_k_slot(params, x):
    p = params["self_attn"]
    slab = (x @ p["qkv_proj"]["kernel"]).reshape(B, T, -1, G + 2, HD)
    q = slab[..., :G, :]
    k = slab[..., G - 1, :]
    v = slab[..., G + 1, :]
    scores = jnp.einsum("bqngd,bknd->bngqk", q, k) * HD ** -0.5
    ctx = jnp.einsum("bngqk,bknd->bqngd", _causal_softmax(scores), v)
    return lax.psum(ctx.reshape(B, T, -1) @ p["o_proj"]["kernel"], "mp")


_PARAM_SPECS = {"self_attn": {"qkv_proj": {"kernel": P(None, "mp")},
                              "o_proj": {"kernel": P("mp", None)}}}


def self_attention_mp(params, x, mesh):
    return jax.shard_map(_local_groups, mesh=mesh, in_specs=(_PARAM_SPECS, P()),
                         out_specs=P())(params, x)


def self_attention_mp_k_slot(params, x, mesh):
    return jax.shard_map(_local_groups_k_slot, mesh=mesh, in_specs=(_PARAM_SPECS, P()),
                         out_specs=P())(params, x)


# ---- one query head per device; the replicated fused kernel is sliced by column offsets --------

def _columns(kernel, group, slot):
    return lax.dynamic_slice_in_dim(kernel, (group * (G + 2) + slot) * HD, HD, axis=1)


def _one_head(kernel, w_o_rows, x, group):
    member = lax.axis_index("mp") % G
    q = x @ _columns(kernel, group, member)
    k = x @ _columns(kernel, group, G)
    v = x @ _columns(kernel, group, G + 1)
    probs = _causal_softmax(jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(HD))
    return lax.psum(jnp.einsum("bqk,bkd->bqd", probs, v) @ w_o_rows, "mp")


def self_attention_head_per_device(params, x, mesh):
    def local(kernel, w_o_rows, x):
        group = lax.axis_index("mp") // G
        return _one_head(kernel, w_o_rows, x, group)

    p = params["self_attn"]
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("mp", None), P()),
                         out_specs=P())(p["qkv_proj"]["kernel"], p["o_proj"]["kernel"], x)


def self_attention_head_per_device_group(params, x, mesh):
    def local(kernel, w_o_rows, x):
        group = lax.axis_index("mp") % HKV
        return _one_head(kernel, w_o_rows, x, group)

    p = params["self_attn"]
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("mp", None), P()),
                         out_specs=P())(p["qkv_proj"]["kernel"], p["o_proj"]["kernel"], x)
