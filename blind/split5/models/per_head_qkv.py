# Bidirectional encoder attention whose fused projection is stored per head: columns are
# [head0: q k v | head1: q k v | ...], so a plain column shard gives each device whole heads.
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class Cfg:
    batch: int = 2
    seq: int = 6
    d_model: int = 24
    heads: int = 4
    head_dim: int = 6


CFG = Cfg()


def shapes(cfg: Cfg = CFG):
    return (jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.d_model), jnp.float32),
            jax.ShapeDtypeStruct((cfg.d_model, cfg.heads * 3 * cfg.head_dim), jnp.float32),
            jax.ShapeDtypeStruct((cfg.heads * cfg.head_dim, cfg.d_model), jnp.float32))


def encoder_attention(x, w_qkv, w_o, cfg: Cfg = CFG):
    b, s, _ = x.shape
    qkv = jnp.dot(x, w_qkv).reshape(b, s, cfg.heads, 3, cfg.head_dim)
    q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
    logits = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(jnp.float32(cfg.head_dim))
    weights = jax.nn.softmax(logits, axis=-1)
    ctx = jnp.einsum("bhst,bthd->bshd", weights, v).reshape(b, s, cfg.heads * cfg.head_dim)
    return jnp.dot(ctx, w_o)


def encoder_attention_tp(x, w_qkv, w_o, mesh, cfg: Cfg = CFG):
    n = mesh.shape["model"]
    local_heads = cfg.heads // n

    def per_device(x, w_qkv, w_o):
        b, s, _ = x.shape
        qkv = jnp.dot(x, w_qkv).reshape(b, s, local_heads, 3, cfg.head_dim)
        q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
        logits = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(jnp.float32(cfg.head_dim))
        weights = jax.nn.softmax(logits, axis=-1)
        ctx = jnp.einsum("bhst,bthd->bshd", weights, v).reshape(b, s, local_heads * cfg.head_dim)
        return jax.lax.psum(jnp.dot(ctx, w_o), "model")

    return jax.shard_map(per_device, mesh=mesh,
                         in_specs=(P(), P(None, "model"), P("model", None)),
                         out_specs=P())(x, w_qkv, w_o)


def encoder_attention_tp_qkv_major(x, w_qkv, w_o, mesh, cfg: Cfg = CFG):
    n = mesh.shape["model"]
    local_heads = cfg.heads // n

    def per_device(x, w_qkv, w_o):
        b, s, _ = x.shape
        qkv = jnp.dot(x, w_qkv).reshape(b, s, 3, local_heads, cfg.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        logits = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(jnp.float32(cfg.head_dim))
        weights = jax.nn.softmax(logits, axis=-1)
        ctx = jnp.einsum("bhst,bthd->bshd", weights, v).reshape(b, s, local_heads * cfg.head_dim)
        return jax.lax.psum(jnp.dot(ctx, w_o), "model")

    return jax.shard_map(per_device, mesh=mesh,
                         in_specs=(P(), P(None, "model"), P("model", None)),
                         out_specs=P())(x, w_qkv, w_o)
