"""Rotary position embeddings in two conventions.

NeoX half-rotation with cos/sin tables built once by a RotaryEmbedding object and sliced per position
(sequence-parallel, tokens start at an integer offset), and GPT-J interleaved pairs applied as 2x2
rotation matrices from packed-sequence position ids (head-parallel).
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, H, HD, MAXPOS = 2, 8, 4, 16, 64


class RotaryEmbedding:
    def __init__(self, dim, max_positions, base=10000.0):
        inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        angles = np.outer(np.arange(max_positions), inv_freq)
        self.cos = jnp.asarray(np.cos(angles), jnp.float32)  # [max_positions, dim/2]
        self.sin = jnp.asarray(np.sin(angles), jnp.float32)

    def tables(self, start, length):
        cos = lax.dynamic_slice_in_dim(self.cos, start, length)
        sin = lax.dynamic_slice_in_dim(self.sin, start, length)
        return cos[None, :, None, :], sin[None, :, None, :]


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def neox_rope(x, cos, sin):
    cos, sin = jnp.concatenate([cos, cos], -1), jnp.concatenate([sin, sin], -1)
    return x * cos + rotate_half(x) * sin


def _attend(q, k, v):
    p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HD), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def neox_inputs():
    f = jax.ShapeDtypeStruct((B, T, H, HD), jnp.float32)
    return f, f, f, jax.ShapeDtypeStruct((), jnp.int32)


def neox_attention(q, k, v, pos0):
    cos, sin = RotaryEmbedding(HD, MAXPOS).tables(pos0, T)
    return _attend(neox_rope(q, cos, sin), neox_rope(k, cos, sin), v)


def _rope_by_halves(x, cos, sin):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _rope_by_halves_strided(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _sp_attention(rope):
    def local(q, k, v, pos0):
        n = q.shape[1]
        cos, sin = RotaryEmbedding(HD, MAXPOS).tables(pos0 + lax.axis_index("sp") * n, n)
        k_all = lax.all_gather(rope(k, cos, sin), "sp", axis=1, tiled=True)
        v_all = lax.all_gather(v, "sp", axis=1, tiled=True)
        return _attend(rope(q, cos, sin), k_all, v_all)
    return local


def neox_attention_sp(q, k, v, pos0, mesh):
    s = P(None, "sp")
    return jax.shard_map(_sp_attention(_rope_by_halves), mesh=mesh, in_specs=(s, s, s, P()),
                         out_specs=s)(q, k, v, pos0)


def neox_attention_sp_strided(q, k, v, pos0, mesh):
    s = P(None, "sp")
    return jax.shard_map(_sp_attention(_rope_by_halves_strided), mesh=mesh, in_specs=(s, s, s, P()),
                         out_specs=s)(q, k, v, pos0)


# ---- GPT-J interleaved pairs as rotation matrices, packed position ids, heads over tp ----------

def gptj_inputs():
    f = jax.ShapeDtypeStruct((B, T, H, HD), jnp.float32)
    return f, f, f, jax.ShapeDtypeStruct((B, T), jnp.int32)


def _rotations(position_ids):
    inv_freq = 1.0 / 10000.0 ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)
    theta = position_ids[..., None].astype(jnp.float32) * inv_freq     # [B, T, HD/2]
    c, s = jnp.cos(theta), jnp.sin(theta)
    return jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], -2)  # [B, T, HD/2, 2, 2]


def gptj_rope(x, rot):
    pairs = x.reshape(*x.shape[:-1], HD // 2, 2)
    return jnp.einsum("bthpi,btpij->bthpj", pairs, rot).reshape(x.shape)


def _causal_attend(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HD)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def gptj_attention(q, k, v, position_ids):
    rot = _rotations(position_ids)
    return _causal_attend(gptj_rope(q, rot), gptj_rope(k, rot), v)


def gptj_attention_tp(q, k, v, position_ids, mesh):
    def local(q, k, v, position_ids):
        rot = _rotations(position_ids)
        q, k = gptj_rope(q, rot), gptj_rope(k, rot)
        return _causal_attend(q, k, v)

    h = P(None, None, "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=(h, h, h, P()), out_specs=h)(q, k, v, position_ids)


def gptj_attention_tp_k_unrotated(q, k, v, position_ids, mesh):
    def local(q, k, v, position_ids):
        rot = _rotations(position_ids)
        q, k = gptj_rope(q, rot), k
        return _causal_attend(q, k, v)

    h = P(None, None, "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=(h, h, h, P()), out_specs=h)(q, k, v, position_ids)
