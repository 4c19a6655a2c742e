"""Rotary embeddings in two production variants.

1. Llama-3.1 RoPE: half-rotation with the "llama3" frequency scaling (low frequencies divided by the
   scale factor, high ones kept, a smooth blend in between), causal attention. Sequence-parallel over
   {sp: 4}: each shard rotates its own tokens at their global positions, K/V all-gathered.
2. ChatGLM-style 2-D RoPE: the first half of every head is rotated by `position_ids`, the second
   half by `block_position_ids` (both int inputs). Heads sharded over {tp: 4}; the serving code
   rotates with a roll of the half plus a sign vector instead of rotate_half.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 32, 4, 16
THETA = 500000.0


def _llama3_inv_freq(dim, factor=8.0, low=1.0, high=4.0, original_ctx=8):
    inv = 1.0 / THETA ** (np.arange(0, dim, 2) / dim)
    wavelen = 2 * math.pi / inv
    smooth = (original_ctx / wavelen - low) / (high - low)
    scaled = np.where(wavelen > original_ctx / low, inv / factor, inv)
    blended = (1 - smooth) * inv / factor + smooth * inv
    is_mid = (wavelen <= original_ctx / low) & (wavelen >= original_ctx / high)
    return np.where(is_mid, blended, scaled).astype(np.float32)


INV_FREQ = _llama3_inv_freq(HD)


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x, positions, inv_freq):
    ang = positions[:, None].astype(jnp.float32) * inv_freq[None, :]
    ang = jnp.concatenate([ang, ang], axis=-1)[:, None, :]            # [S, 1, dim]
    return x * jnp.cos(ang) + rotate_half(x) * jnp.sin(ang)


def llama_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD)}, f(B, S, D)


def _attend(q, k, v, q_pos, k_pos):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HD)
    mask = q_pos[:, None] >= k_pos[None, :]
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.where(mask, scores, -1e30), -1), v)


def llama_rope_attention(w, x):
    q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w[n]) for n in ("wq", "wk", "wv"))
    pos = jnp.arange(S)
    return _attend(apply_rope(q, pos, INV_FREQ), apply_rope(k, pos, INV_FREQ), v, pos, pos)


def _rope_positions(local):
    return lax.axis_index("sp") * local + jnp.arange(local)


def _rope_positions_unscaled(local):
    return lax.axis_index("sp") + jnp.arange(local)


def _sp_local(w, x, rope_positions):
    local = x.shape[1]
    q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w[n]) for n in ("wq", "wk", "wv"))
    rpos = rope_positions(local)
    q, k = apply_rope(q, rpos, INV_FREQ), apply_rope(k, rpos, INV_FREQ)
    k_all = lax.all_gather(k, "sp", axis=1, tiled=True)
    v_all = lax.all_gather(v, "sp", axis=1, tiled=True)
    q_pos = lax.axis_index("sp") * local + jnp.arange(local)
    return _attend(q, k_all, v_all, q_pos, jnp.arange(S))


def _llama_sp(w, x, mesh, rope_positions):
    fn = jax.shard_map(lambda w, x: _sp_local(w, x, rope_positions), mesh=mesh,
                       in_specs=(P(), P(None, "sp")), out_specs=P(None, "sp"))
    return fn(w, x)


def llama_rope_attention_sp(w, x, mesh):
    return _llama_sp(w, x, mesh, _rope_positions)


def llama_rope_attention_sp_offset(w, x, mesh):
    return _llama_sp(w, x, mesh, _rope_positions_unscaled)


# ---- 2. ChatGLM 2-D RoPE, heads sharded -----------------------------------------------------------

GLM_INV_FREQ = (1.0 / 10000.0 ** (np.arange(0, HD // 2, 2) / (HD // 2))).astype(np.float32)


def glm_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = jax.ShapeDtypeStruct((B, S), jnp.int32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}, f(B, S, D), i, i


def _rope_batched(x, positions):
    return jax.vmap(lambda xb, pb: apply_rope(xb, pb, GLM_INV_FREQ))(x, positions)


def _glm_rotate(x, pos, block_pos):
    a, b = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([_rope_batched(a, pos), _rope_batched(b, block_pos)], axis=-1)


def _glm_attention(q, k, v, wo):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HD)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bqhd,hde->bqe", ctx, wo)


def glm_attention(w, x, pos, block_pos):
    q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w[n]) for n in ("wq", "wk", "wv"))
    q, k = _glm_rotate(q, pos, block_pos), _glm_rotate(k, pos, block_pos)
    return _glm_attention(q, k, v, w["wo"])


QUARTER = HD // 4
SIGN = np.concatenate([-np.ones(QUARTER), np.ones(QUARTER)]).astype(np.float32)
SIGN_FLIPPED = np.concatenate([np.ones(QUARTER), -np.ones(QUARTER)]).astype(np.float32)


def _rotary_half_block(x, positions, sign):
    ang = positions[..., None].astype(jnp.float32) * GLM_INV_FREQ
    cos = jnp.tile(jnp.cos(ang), 2)[:, :, None, :]                   # [B, S, 1, HD/2]
    sin = jnp.tile(jnp.sin(ang), 2)[:, :, None, :]
    return x * cos + jnp.roll(x, QUARTER, axis=-1) * sign * sin


def _glm_local(w, x, pos, block_pos, sign):
    q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w[n]) for n in ("wq", "wk", "wv"))
    rot = lambda t: jnp.concatenate([_rotary_half_block(t[..., :HD // 2], pos, sign),
                                     _rotary_half_block(t[..., HD // 2:], block_pos, sign)], -1)
    return lax.psum(_glm_attention(rot(q), rot(k), v, w["wo"]), "tp")


def _glm_tp(w, x, pos, block_pos, mesh, sign):
    specs = {"wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp")}
    fn = jax.shard_map(lambda *a: _glm_local(*a, sign=sign), mesh=mesh,
                       in_specs=(specs, P(), P(), P()), out_specs=P())
    return fn(w, x, pos, block_pos)


def glm_attention_tp(w, x, pos, block_pos, mesh):
    return _glm_tp(w, x, pos, block_pos, mesh, SIGN)


def glm_attention_tp_sign(w, x, pos, block_pos, mesh):
    return _glm_tp(w, x, pos, block_pos, mesh, SIGN_FLIPPED)
