"""Left-padded batch prefill (HF-style `attention_mask` with padding on the left): positions are
`cumsum(mask) - 1` (0 on padding), added through a learned position table; attention is causal and
ignores padded keys; padded query rows output zero. Padding lengths come as an int vector [B].

Sequence parallel on {sp: 4}; K and V are all-gathered along the sequence in both versions:
- `prefill_sp_arith`: the device's global token indices `axis_index * S_LOCAL + iota` give the
  positions directly as `index - pad`;
- `prefill_sp_prefix`: positions from a local `cumsum` of the mask plus the count of real tokens on
  the preceding devices (an exclusive prefix over the all-gathered per-device counts).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H = 3, 16, 16, 2
HD = D // H
AXIS = "sp"
N = 4
S_LOCAL = S // N


def prefill_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"pos_emb": f(S, D), "wq": f(D, D), "wk": f(D, D), "wv": f(D, D), "wo": f(D, D)}
    return params, f(B, S, D), jax.ShapeDtypeStruct((B,), jnp.int32)


def _split_heads(t):
    return t.reshape(t.shape[0], t.shape[1], H, HD)


def _attend(p, h_q, h_kv, q_valid, q_idx, k_valid, k_idx):
    q = _split_heads(h_q @ p["wq"])
    k, v = _split_heads(h_kv @ p["wk"]), _split_heads(h_kv @ p["wv"])
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HD ** -0.5
    allowed = (k_idx[None, :] <= q_idx[:, None])[None] & k_valid[:, None, :]
    s = jnp.where(allowed[:, None], s, -1e30)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(h_q.shape)
    return jnp.where(q_valid[..., None], o @ p["wo"], 0.0)


def prefill(params, x, pad):
    idx = jnp.arange(S)
    valid = idx[None, :] >= pad[:, None]
    pos = jnp.where(valid, jnp.cumsum(valid, axis=1) - 1, 0)
    h = x + params["pos_emb"][pos]
    return _attend(params, h, h, valid, idx, valid, idx)


def _gather_seq(t):
    return lax.all_gather(t, AXIS, axis=1, tiled=True)


def _sp(local, params, x, pad, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, AXIS), P()),
                         out_specs=P(None, AXIS))(params, x, pad)


# ---- positions from global indices -------------------------------------------------------------

def _arith_local(strict):
    def local(params, x, pad):
        g_idx = lax.axis_index(AXIS) * S_LOCAL + jnp.arange(S_LOCAL)
        if strict:
            valid = g_idx[None, :] > pad[:, None]
        else:
            valid = g_idx[None, :] >= pad[:, None]
        pos = jnp.where(valid, g_idx[None, :] - pad[:, None], 0)
        h = x + jnp.take(params["pos_emb"], pos, axis=0)
        k_idx = jnp.arange(S)
        return _attend(params, h, _gather_seq(h), valid, g_idx, k_idx[None, :] >= pad[:, None], k_idx)
    return local


def prefill_sp_arith(params, x, pad, mesh):
    return _sp(_arith_local(False), params, x, pad, mesh)


def prefill_sp_arith_strict(params, x, pad, mesh):
    return _sp(_arith_local(True), params, x, pad, mesh)


# ---- positions from a cross-device prefix count ------------------------------------------------

def _tokens_before(valid, inclusive):
    counts = lax.all_gather(jnp.sum(valid, axis=1), AXIS)          # [N, B]
    me = lax.axis_index(AXIS)
    before = jnp.arange(N) <= me if inclusive else jnp.arange(N) < me
    return jnp.sum(jnp.where(before[:, None], counts, 0), axis=0)  # [B]


def _prefix_local(inclusive):
    def local(params, x, pad):
        g_idx = lax.axis_index(AXIS) * S_LOCAL + jnp.arange(S_LOCAL)
        valid = g_idx[None, :] >= pad[:, None]
        run = jnp.cumsum(valid, axis=1) + _tokens_before(valid, inclusive)[:, None]
        pos = jnp.where(valid, run - 1, 0)
        h = x + params["pos_emb"][pos]
        k_valid = _gather_seq(valid)
        return _attend(params, h, _gather_seq(h), valid, g_idx, k_valid, jnp.arange(S))
    return local


def prefill_sp_prefix(params, x, pad, mesh):
    return _sp(_prefix_local(False), params, x, pad, mesh)


def prefill_sp_prefix_inclusive(params, x, pad, mesh):
    return _sp(_prefix_local(True), params, x, pad, mesh)
