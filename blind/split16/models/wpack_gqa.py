"""Baichuan-style `W_pack` grouped-query attention: one fused kernel [D, (H + 2*KV) * HD] laid out
[all q heads | all k heads | all v heads], 8 query heads sharing 4 kv heads (groups of 2),
bidirectional (encoder) softmax attention, output projection [H*HD, D].

Tensor parallel over {tp: 2}, 4 query heads and their 2 kv heads per device:

- `gqa_repacked`: the fused kernel is re-packed outside the shard_map into per-shard
  [q_t | k_t | v_t] column blocks with einops-style helpers, then column-sharded;
- `gqa_take`: the kernel stays replicated and each device gathers its own columns with `jnp.take`
  from index vectors built from `axis_index`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D = 2, 8, 32
H, KV, HD = 8, 4, 8
G = H // KV
TP = 2
HL, KVL = H // TP, KV // TP


def gqa_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, (H + 2 * KV) * HD), f(H * HD, D), f(B, S, D)


def rearrange_split_heads(t, hd):
    """'b s (h d) -> b h s d'"""
    b, s, hd_all = t.shape
    return t.reshape(b, s, hd_all // hd, hd).transpose(0, 2, 1, 3)


def rearrange_merge_heads(t):
    """'b h s d -> b s (h d)'"""
    b, h, s, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def expand_kv(t, groups):
    return jnp.repeat(t, groups, axis=1)


def expand_kv_tiled(t, groups):
    return jnp.tile(t, (1, groups, 1, 1))


def _attend(qkv, n_q, n_kv, expand=expand_kv):
    q, k, v = jnp.split(qkv, [n_q * HD, (n_q + n_kv) * HD], axis=-1)
    q, k, v = (rearrange_split_heads(t, HD) for t in (q, k, v))
    k, v = expand(k, n_q // n_kv), expand(v, n_q // n_kv)
    w = jax.nn.softmax(jnp.einsum("...qd,...kd->...qk", q, k) * HD ** -0.5, axis=-1)
    return rearrange_merge_heads(jnp.einsum("...qk,...kd->...qd", w, v))


def gqa(w_pack, w_o, x):
    return _attend(x @ w_pack, H, KV) @ w_o


# ---- re-packed per shard -------------------------------------------------------------------------

def repack_for_tp(w_pack):
    """[D, (H + 2KV) HD] -> [D, TP * (HL + 2 KVL) HD] with shard t's q, k, v columns contiguous."""
    q, k, v = jnp.split(w_pack, [H * HD, (H + KV) * HD], axis=1)
    q = q.reshape(D, TP, HL * HD)
    k = k.reshape(D, TP, KVL * HD)
    v = v.reshape(D, TP, KVL * HD)
    return jnp.concatenate([q, k, v], axis=2).reshape(D, -1)


def _repacked(expand, w_pack, w_o, x, mesh):
    def local(w, wo, xb):
        return lax.psum(_attend(xb @ w, HL, KVL, expand=expand) @ wo, "tp")

    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P()),
                         out_specs=P())(repack_for_tp(w_pack), w_o, x)


def gqa_repacked(w_pack, w_o, x, mesh):
    return _repacked(expand_kv, w_pack, w_o, x, mesh)


def gqa_repacked_tiled_kv(w_pack, w_o, x, mesh):
    return _repacked(expand_kv_tiled, w_pack, w_o, x, mesh)


# ---- per-device column gather ----------------------------------------------------------------------

def _head_columns(first_head, n_heads):
    return (first_head * HD + jnp.arange(n_heads * HD)).astype(jnp.int32)


def _my_columns(t):
    q_cols = _head_columns(t * HL, HL)
    k_cols = _head_columns(H + t * KVL, KVL)
    v_cols = _head_columns(H + KV + t * KVL, KVL)
    return jnp.concatenate([q_cols, k_cols, v_cols])


def _my_columns_k_unshifted(t):
    q_cols = _head_columns(t * HL, HL)
    k_cols = _head_columns(t * KVL, KVL)
    v_cols = _head_columns(H + KV + t * KVL, KVL)
    return jnp.concatenate([q_cols, k_cols, v_cols])


def _taken(columns, w_pack, w_o, x, mesh):
    def local(w, wo, xb):
        mine = jnp.take(w, columns(lax.axis_index("tp")), axis=1)
        return lax.psum(_attend(xb @ mine, HL, KVL) @ wo, "tp")

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("tp", None), P()),
                         out_specs=P())(w_pack, w_o, x)


def gqa_take(w_pack, w_o, x, mesh):
    return _taken(_my_columns, w_pack, w_o, x, mesh)


def gqa_take_k_offset(w_pack, w_o, x, mesh):
    return _taken(_my_columns_k_unshifted, w_pack, w_o, x, mesh)
