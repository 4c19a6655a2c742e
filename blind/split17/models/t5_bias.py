"""T5-style bidirectional encoder self-attention with learned relative-position biases: relative
distances k - q are bucketed (16 buckets per direction, 8 exact, log-spaced up to 64) and each
bucket has one bias per head. No 1/sqrt(d) scaling (T5 folds it into the init).

- `t5_attn_2d`: on {sp: 2, hp: 2}: query rows over sp (each device slices its rows of the full
  sequence, keys stay whole), heads and the bias table's head columns over hp, psum over hp;
- `t5_attn_lut`: on {sp: 4}: query rows over sp; the buckets come from a lookup table built once for
  every distance in [-(S-1), S-1] and are read with `jnp.take(..., mode="clip")`.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 32, 32, 4, 8
NUM_BUCKETS, MAX_DISTANCE = 32, 64


def t5_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"q": f(D, H, HD), "k": f(D, H, HD), "v": f(D, H, HD), "o": f(H, HD, D),
              "rel_bias": f(NUM_BUCKETS, H)}
    return params, f(B, S, D)


def relative_bucket(rel):
    half = NUM_BUCKETS // 2
    bucket = (rel > 0).astype(jnp.int32) * half
    n = jnp.abs(rel)
    max_exact = half // 2
    scaled = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact)
    scaled = scaled / math.log(MAX_DISTANCE / max_exact) * (half - max_exact)
    large = jnp.minimum(max_exact + scaled.astype(jnp.int32), half - 1)
    return bucket + jnp.where(n < max_exact, n, large)


def _attend(p, xq, xk, bias):
    q = jnp.einsum("bsd,dhk->bhsk", xq, p["q"])
    k = jnp.einsum("bsd,dhk->bhsk", xk, p["k"])
    v = jnp.einsum("bsd,dhk->bhsk", xk, p["v"])
    probs = jax.nn.softmax(jnp.einsum("bhqk,bhsk->bhqs", q, k) + bias[None], axis=-1)
    return jnp.einsum("bhqs,bhsk,hkd->bqd", probs, v, p["o"])


def t5_attention(p, x):
    pos = jnp.arange(S)
    buckets = relative_bucket(pos[None, :] - pos[:, None])
    bias = jnp.transpose(p["rel_bias"][buckets], (2, 0, 1))  # [H, q, k]
    return _attend(p, x, x, bias)


# ---- queries over sp, heads over hp -----------------------------------------------------------------

def _local_2d(p, x, offset_axis):
    rows = S // lax.axis_size("sp")
    start = lax.axis_index(offset_axis) * rows
    xq = lax.dynamic_slice_in_dim(x, start, rows, axis=1)
    q_pos = start + jnp.arange(rows)
    buckets = relative_bucket(jnp.arange(S)[None, :] - q_pos[:, None])
    bias = jnp.transpose(p["rel_bias"][buckets], (2, 0, 1))
    return lax.psum(_attend(p, xq, x, bias), "hp")


def _two_d(p, x, mesh, offset_axis):
    heads = P(None, "hp", None)
    specs = {"q": heads, "k": heads, "v": heads, "o": P("hp", None, None),
             "rel_bias": P(None, "hp")}
    return jax.shard_map(lambda p_, x_: _local_2d(p_, x_, offset_axis), mesh=mesh,
                         in_specs=(specs, P()), out_specs=P(None, "sp"), check_vma=False)(p, x)


def t5_attn_2d(p, x, mesh):
    return _two_d(p, x, mesh, offset_axis="sp")


def t5_attn_2d_offset_from_hp(p, x, mesh):
    return _two_d(p, x, mesh, offset_axis="hp")


# ---- bucket lookup table ----------------------------------------------------------------------------

def _bucket_lut(positive):
    rel = jnp.arange(-(S - 1), S)
    half = NUM_BUCKETS // 2
    exact = half // 2
    n = jnp.abs(rel)
    far = jnp.log(jnp.maximum(n, 1) / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)
    near_or_far = jnp.select([n < exact], [n], jnp.minimum(exact + far.astype(jnp.int32), half - 1))
    return jnp.where(positive(rel), half, 0) + near_or_far


def _local_lut(p, x, positive):
    rows = S // lax.axis_size("sp")
    start = lax.axis_index("sp") * rows
    xq = lax.dynamic_slice_in_dim(x, start, rows, axis=1)
    rel = jnp.arange(S)[None, :] - (start + jnp.arange(rows))[:, None]
    buckets = jnp.take(_bucket_lut(positive), rel + (S - 1), mode="clip")
    bias = jnp.moveaxis(jnp.take(p["rel_bias"], buckets, axis=0), -1, 0)
    return _attend(p, xq, x, bias)


def _lut(p, x, mesh, positive):
    return jax.shard_map(lambda p_, x_: _local_lut(p_, x_, positive), mesh=mesh,
                         in_specs=(P(), P()), out_specs=P(None, "sp"), check_vma=False)(p, x)


def t5_attn_lut(p, x, mesh):
    return _lut(p, x, mesh, positive=lambda rel: rel > 0)


def t5_attn_lut_sign_at_zero(p, x, mesh):
    return _lut(p, x, mesh, positive=lambda rel: rel >= 0)
