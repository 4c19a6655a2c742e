"""GPT-NeoX-style partial rotary embedding (rotary on the first half of each head, the rest passed
through) with NTK-aware scaled frequencies (base * ALPHA ** (R / (R - 2))), half-rotation
(rotate_half) layout, positions given per token (`position_ids` [B, S], int in [0, 64)). The layer
returns the rotated query and key projections [B, S, H, HD] of x.

- `rope_heads_tp` on {tp: 4}: 2 heads per device, projections column-sharded, cos / sin read from a
  precomputed [MAX_POS, R] table at the position ids (`jnp.take`);
- `rope_seq_2d` on {dp: 2, sp: 2}: x and position_ids sharded over batch and sequence, weights
  replicated, angles computed on the fly from the position ids.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

B, S, D, H = 4, 8, 32, 4
HD = D // H
R = HD // 2
MAX_POS = 64
BASE, ALPHA = 10000.0, 4.0


def _inv_freq():
    base = BASE * ALPHA ** (R / (R - 2))
    return 1.0 / base ** (np.arange(0, R, 2, dtype=np.float64) / R)


def _table():
    ang = np.arange(MAX_POS)[:, None] * _inv_freq()[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H * HD), "wk": f(D, H * HD)}, f(B, S, D), jax.ShapeDtypeStruct((B, S), jnp.int32)


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def _apply(t, cos, sin):
    rot, rest = t[..., :R], t[..., R:]
    return jnp.concatenate([rot * cos + rotate_half(rot) * sin, rest], axis=-1)


def partial_rope(p, x, position_ids):
    cos_t, sin_t = _table()
    cos = jnp.asarray(cos_t)[position_ids][:, :, None, :]
    sin = jnp.asarray(sin_t)[position_ids][:, :, None, :]
    q = (x @ p["wq"]).reshape(B, S, H, HD)
    k = (x @ p["wk"]).reshape(B, S, H, HD)
    return _apply(q, cos, sin), _apply(k, cos, sin)


# ---- heads over tp, table lookup -------------------------------------------------------------------

def _apply_pass_first(t, cos, sin):
    rot, rest = t[..., :R], t[..., R:]
    return jnp.concatenate([rest, rot * cos + rotate_half(rot) * sin], axis=-1)


def _heads_local(apply):
    def local(p, x, position_ids):
        cos_t, sin_t = _table()
        cos = jnp.take(jnp.asarray(cos_t), position_ids, axis=0)[:, :, None, :]
        sin = jnp.take(jnp.asarray(sin_t), position_ids, axis=0)[:, :, None, :]
        q = (x @ p["wq"]).reshape(B, S, -1, HD)
        k = (x @ p["wk"]).reshape(B, S, -1, HD)
        return apply(q, cos, sin), apply(k, cos, sin)
    return local


HEAD_SPECS = ({"wq": P(None, "tp"), "wk": P(None, "tp")}, P(), P())
HEAD_OUT = (P(None, None, "tp"), P(None, None, "tp"))


def rope_heads_tp(p, x, position_ids, mesh):
    return jax.shard_map(_heads_local(_apply), mesh=mesh, in_specs=HEAD_SPECS, out_specs=HEAD_OUT,
                         check_vma=False)(p, x, position_ids)


def rope_heads_tp_pass_through_first(p, x, position_ids, mesh):
    return jax.shard_map(_heads_local(_apply_pass_first), mesh=mesh, in_specs=HEAD_SPECS,
                         out_specs=HEAD_OUT, check_vma=False)(p, x, position_ids)


# ---- batch x sequence, angles on the fly ------------------------------------------------------------

def _rotate_half_flipped(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x2, -x1], axis=-1)


def _seq_local(rotate):
    def local(p, x, position_ids):
        inv_freq = 1.0 / (BASE * ALPHA ** (R / (R - 2))) ** (jnp.arange(0, R, 2, dtype=jnp.float32) / R)
        ang = position_ids[..., None].astype(jnp.float32) * inv_freq
        ang = jnp.concatenate([ang, ang], axis=-1)[:, :, None, :]
        cos, sin = jnp.cos(ang), jnp.sin(ang)
        bl, sl = x.shape[:2]
        out = []
        for w in (p["wq"], p["wk"]):
            t = (x @ w).reshape(bl, sl, H, HD)
            rot, rest = t[..., :R], t[..., R:]
            out.append(jnp.concatenate([rot * cos + rotate(rot) * sin, rest], axis=-1))
        return tuple(out)
    return local


SEQ_SPECS = ({"wq": P(), "wk": P()}, P("dp", "sp"), P("dp", "sp"))
SEQ_OUT = (P("dp", "sp"), P("dp", "sp"))


def rope_seq_2d(p, x, position_ids, mesh):
    return jax.shard_map(_seq_local(rotate_half), mesh=mesh, in_specs=SEQ_SPECS, out_specs=SEQ_OUT,
                         check_vma=False)(p, x, position_ids)


def rope_seq_2d_flipped_sign(p, x, position_ids, mesh):
    return jax.shard_map(_seq_local(_rotate_half_flipped), mesh=mesh, in_specs=SEQ_SPECS,
                         out_specs=SEQ_OUT, check_vma=False)(p, x, position_ids)
