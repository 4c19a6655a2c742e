"""Interleaved (GPT-J / Meta llama reference) rotary embedding. The reference follows the original
code: adjacent feature pairs viewed as complex numbers and multiplied by e^{i*pos*theta}. The
sequence-parallel version is written in real arithmetic on (pairs, 2) views."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, HEADS, HEAD_DIM, DIM = 2, 16, 2, 8, 16
SP = 4
BASE = 10000.0


def _theta():
    return BASE ** (-jnp.arange(0, HEAD_DIM, 2, dtype=jnp.float32) / HEAD_DIM)   # [hd/2]


def rope_complex(t, pos):
    """t [B, S, H, hd]; pos [S]."""
    pairs = t.reshape(*t.shape[:-1], HEAD_DIM // 2, 2)
    z = lax.complex(pairs[..., 0], pairs[..., 1])
    rot = jnp.exp(1j * (pos[:, None].astype(jnp.float32) * _theta()))       # [S, hd/2]
    z = z * rot[None, :, None, :]
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1).reshape(t.shape)


def qk_rotary(x, wq, wk):
    q = (x @ wq).reshape(BATCH, SEQ, HEADS, HEAD_DIM)
    k = (x @ wk).reshape(BATCH, SEQ, HEADS, HEAD_DIM)
    pos = jnp.arange(SEQ)
    return rope_complex(q, pos), rope_complex(k, pos)


def _rope_real(t, pos, pair_view):
    ang = pos[:, None].astype(jnp.float32) * _theta()
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    a, b = pair_view(t)
    out_a = a * cos - b * sin
    out_b = a * sin + b * cos
    return jnp.stack([out_a, out_b], axis=-1).reshape(t.shape)


def _adjacent(t):
    p = t.reshape(*t.shape[:-1], HEAD_DIM // 2, 2)
    return p[..., 0], p[..., 1]


def _halves(t):
    p = t.reshape(*t.shape[:-1], 2, HEAD_DIM // 2)
    return p[..., 0, :], p[..., 1, :]


def _qk_rotary_sp(pair_view):
    chunk = SEQ // SP

    def local(x, wq, wk):
        pos = chunk * lax.axis_index("sp") + jnp.arange(chunk)
        q = (x @ wq).reshape(BATCH, chunk, HEADS, HEAD_DIM)
        k = (x @ wk).reshape(BATCH, chunk, HEADS, HEAD_DIM)
        return _rope_real(q, pos, pair_view), _rope_real(k, pos, pair_view)

    seq = P(None, "sp")
    return jax.shard_map(local, in_specs=(seq, P(), P()), out_specs=(seq, seq))


def qk_rotary_sp(x, wq, wk):
    return _qk_rotary_sp(_adjacent)(x, wq, wk)


def qk_rotary_sp_half_split(x, wq, wk):
    return _qk_rotary_sp(_halves)(x, wq, wk)


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, DIM), f),
            jax.ShapeDtypeStruct((DIM, HEADS * HEAD_DIM), f),
            jax.ShapeDtypeStruct((DIM, HEADS * HEAD_DIM), f))
