"""Encoder-decoder cross-attention sub-layer (decoder queries over padded encoder states) with a
pre-LN, a residual, and an encoder padding mask from `enc_last` (index of each example's last
valid encoder token, so key j is valid iff j <= enc_last).

Sharded by jit alone on {data: 2, model: 4} (no shard_map, no collectives written by hand):

- `cross_attn_constrained`: the step is one function whose q, k, v and context are pinned to
  `NamedSharding(mesh, P("data", None, "model", None))` with `with_sharding_constraint`;
- `cross_attn_two_jits`: the encoder k/v projection is its own `jax.jit` with `out_shardings`
  (heads-first [B, H, Sk, HD] over model), computed once and passed to a second jitted decoder-side
  function that works heads-first as well.
"""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, SQ, SK, D, H = 4, 8, 12, 32, 4
HD = D // H


def cross_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"ln_g": f(D), "wq": f(D, H * HD), "wk": f(D, H * HD), "wv": f(D, H * HD),
              "wo": f(H * HD, D)}
    return params, f(B, SQ, D), f(B, SK, D), jax.ShapeDtypeStruct((B,), jnp.int32)


def _norm(x, g):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


def _key_mask(enc_last):
    return jnp.arange(SK)[None, :] <= enc_last[:, None]


def _key_mask_exclusive(enc_last):
    return jnp.arange(SK)[None, :] < enc_last[:, None]


def cross_attn(params, x, enc, enc_last):
    h = _norm(x, params["ln_g"])
    q = (h @ params["wq"]).reshape(B, SQ, H, HD)
    k = (enc @ params["wk"]).reshape(B, SK, H, HD)
    v = (enc @ params["wv"]).reshape(B, SK, H, HD)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    s = jnp.where(_key_mask(enc_last)[:, None, None, :], s, -1e9)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)
    return x + o.reshape(B, SQ, D) @ params["wo"]


# ---- constraints inside one step ---------------------------------------------------------------------

def _constrained(key_mask, params, x, enc, enc_last, mesh):
    heads = NamedSharding(mesh, P("data", None, "model", None))
    rows = NamedSharding(mesh, P("data"))
    pin = jax.lax.with_sharding_constraint
    x, enc, enc_last = pin(x, rows), pin(enc, rows), pin(enc_last, rows)
    h = _norm(x, params["ln_g"])
    q = pin((h @ params["wq"]).reshape(B, SQ, H, HD), heads)
    k = pin((enc @ params["wk"]).reshape(B, SK, H, HD), heads)
    v = pin((enc @ params["wv"]).reshape(B, SK, H, HD), heads)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    s = jnp.where(key_mask(enc_last)[:, None, None, :], s, -1e9)
    o = pin(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v), heads)
    return pin(x + o.reshape(B, SQ, D) @ params["wo"], rows)


def cross_attn_constrained(params, x, enc, enc_last, mesh):
    return _constrained(_key_mask, params, x, enc, enc_last, mesh)


def cross_attn_constrained_exclusive_mask(params, x, enc, enc_last, mesh):
    return _constrained(_key_mask_exclusive, params, x, enc, enc_last, mesh)


# ---- two jits, heads-first ---------------------------------------------------------------------------

def _to_heads_first(t, s):
    return t.reshape(B, s, H, HD).transpose(0, 2, 1, 3)


def _merge_heads(o):
    return o.transpose(0, 2, 1, 3).reshape(B, SQ, D)


def _merge_heads_no_transpose(o):
    return o.reshape(B, SQ, D)


def _encoder_kv(params, enc):
    return _to_heads_first(enc @ params["wk"], SK), _to_heads_first(enc @ params["wv"], SK)


def _decoder_side(params, x, k, v, enc_last, merge):
    h = _norm(x, params["ln_g"])
    q = _to_heads_first(h @ params["wq"], SQ)
    s = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(HD)
    s = jnp.where(_key_mask(enc_last)[:, None, None, :], s, -1e9)
    return x + merge(jax.nn.softmax(s, -1) @ v) @ params["wo"]


def _two_jits(merge, params, x, enc, enc_last, mesh):
    heads = NamedSharding(mesh, P("data", "model"))
    rows = NamedSharding(mesh, P("data"))
    k, v = jax.jit(_encoder_kv, out_shardings=(heads, heads))(params, enc)
    step = jax.jit(lambda p, x, k, v, n: _decoder_side(p, x, k, v, n, merge), out_shardings=rows)
    return step(params, x, k, v, enc_last)


def cross_attn_two_jits(params, x, enc, enc_last, mesh):
    return _two_jits(_merge_heads, params, x, enc, enc_last, mesh)


def cross_attn_two_jits_unmerged(params, x, enc, enc_last, mesh):
    return _two_jits(_merge_heads_no_transpose, params, x, enc, enc_last, mesh)
