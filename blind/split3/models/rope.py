"""Rotary position embeddings on sequence-sharded queries and keys, two conventions:
GPT-J interleaved pairs (x[2i], x[2i+1]) and GPT-NeoX half rotation with a precomputed table."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class RopeConfig:
    batch: int = 2
    seq: int = 16
    heads: int = 2
    head_dim: int = 8
    base: float = 10000.0
    max_seq: int = 64


CFG = RopeConfig()


def _inv_freq(cfg):
    return 1.0 / (cfg.base ** (jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim))


def rope_interleaved(x, positions, cfg=CFG):
    ang = positions[:, None].astype(jnp.float32) * _inv_freq(cfg)[None, :]  # [s, d/2]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return rotated.reshape(x.shape)


def qk_interleaved(q, k):
    pos = jnp.arange(CFG.seq)
    return rope_interleaved(q, pos), rope_interleaved(k, pos)


def qk_inputs():
    s = jax.ShapeDtypeStruct((CFG.batch, CFG.seq, CFG.heads, CFG.head_dim), jnp.float32)
    return s, s


_SEQ = P(None, "seq", None, None)


def qk_interleaved_sp(q, k, mesh):
    local = CFG.seq // mesh.shape["seq"]

    def per_shard(qs, ks):
        pos = lax.axis_index("seq") * local + jnp.arange(local)
        return rope_interleaved(qs, pos), rope_interleaved(ks, pos)

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(_SEQ, _SEQ), out_specs=(_SEQ, _SEQ))(q, k)


def qk_interleaved_sp_concat(q, k, mesh):
    local = CFG.seq // mesh.shape["seq"]

    def rope_local(x, positions):
        ang = positions[:, None].astype(jnp.float32) * _inv_freq(CFG)[None, :]
        cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        return jnp.concatenate([even * cos - odd * sin, even * sin + odd * cos], axis=-1)

    def per_shard(qs, ks):
        pos = lax.axis_index("seq") * local + jnp.arange(local)
        return rope_local(qs, pos), rope_local(ks, pos)

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(_SEQ, _SEQ), out_specs=(_SEQ, _SEQ))(q, k)


# ---- NeoX convention: cos/sin tables for max_seq positions, built once and sliced ----


def rope_tables(cfg=CFG):
    ang = jnp.arange(cfg.max_seq, dtype=jnp.float32)[:, None] * _inv_freq(cfg)[None, :]
    ang = jnp.concatenate([ang, ang], axis=-1)  # [max_seq, d]
    return jnp.cos(ang), jnp.sin(ang)


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_neox(x, cos, sin):
    return x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]


def attn_scores_neox(q, k):
    cos, sin = rope_tables()
    cos, sin = cos[: CFG.seq], sin[: CFG.seq]
    qr, kr = apply_neox(q, cos, sin), apply_neox(k, cos, sin)
    return jnp.einsum("bqhd,bkhd->bhqk", qr, kr)


def attn_scores_neox_cp(q, k, mesh):
    n = mesh.shape["seq"]
    local = CFG.seq // n

    def per_shard(qs, ks):
        cos, sin = rope_tables()
        offset = lax.axis_index("seq") * local
        cos_l = lax.dynamic_slice_in_dim(cos, offset, local)
        sin_l = lax.dynamic_slice_in_dim(sin, offset, local)
        qr, kr = apply_neox(qs, cos_l, sin_l), apply_neox(ks, cos_l, sin_l)
        kr_all = lax.all_gather(kr, "seq", axis=1, tiled=True)
        return jnp.einsum("bqhd,bkhd->bhqk", qr, kr_all)

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(_SEQ, _SEQ), out_specs=P(None, None, "seq", None))(q, k)


def attn_scores_neox_cp_global_offset(q, k, mesh):
    n = mesh.shape["seq"]
    local = CFG.seq // n

    def per_shard(qs, ks):
        cos, sin = rope_tables()
        offset = lax.axis_index("seq") * CFG.seq
        cos_l = lax.dynamic_slice_in_dim(cos, offset, local)
        sin_l = lax.dynamic_slice_in_dim(sin, offset, local)
        qr, kr = apply_neox(qs, cos_l, sin_l), apply_neox(ks, cos_l, sin_l)
        kr_all = lax.all_gather(kr, "seq", axis=1, tiled=True)
        return jnp.einsum("bqhd,bkhd->bhqk", qr, kr_all)

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(_SEQ, _SEQ), out_specs=P(None, None, "seq", None))(q, k)
