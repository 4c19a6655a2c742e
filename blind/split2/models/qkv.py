"""Self-attention written as a class around a config object, with one fused QKV weight.

The fused weight is `[d_model, 3 * n_heads * head_dim]` laid out as (q|k|v, head, head_dim). The
tensor-parallel versions view it as `[d_model, 3, n_heads, head_dim]` and shard the head dimension,
so every rank gets `[d_model, 3, n_heads / tp, head_dim]`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class AttnConfig:
    d_model: int = 32
    n_heads: int = 4
    n_kv_heads: int = 4
    head_dim: int = 8
    batch: int = 2
    seq: int = 8

    @property
    def q_width(self):
        return self.n_heads * self.head_dim

    @property
    def kv_width(self):
        return self.n_kv_heads * self.head_dim


MHA = AttnConfig()
GQA = AttnConfig(n_heads=4, n_kv_heads=2)


class SelfAttention:
    def __init__(self, cfg: AttnConfig):
        self.cfg = cfg

    def scores(self, q, k, v):
        """q: [b, s, h, hd]; k, v: [b, s, h, hd] (already repeated for GQA). Causal."""
        cfg = self.cfg
        logits = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(jnp.float32(cfg.head_dim))
        causal = jnp.tril(jnp.ones((cfg.seq, cfg.seq), bool))
        logits = jnp.where(causal, logits, -1e9)
        return jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(logits, axis=-1), v)

    def __call__(self, w_qkv, w_out, x):
        cfg = self.cfg
        fused = x @ w_qkv
        q = fused[..., :cfg.q_width].reshape(cfg.batch, cfg.seq, cfg.n_heads, cfg.head_dim)
        k = fused[..., cfg.q_width:cfg.q_width + cfg.kv_width]
        v = fused[..., cfg.q_width + cfg.kv_width:]
        k = k.reshape(cfg.batch, cfg.seq, cfg.n_kv_heads, cfg.head_dim)
        v = v.reshape(cfg.batch, cfg.seq, cfg.n_kv_heads, cfg.head_dim)
        group = cfg.n_heads // cfg.n_kv_heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        ctx = self.scores(q, k, v).reshape(cfg.batch, cfg.seq, cfg.q_width)
        return ctx @ w_out


def mha(w_qkv, w_out, x):
    return SelfAttention(MHA)(w_qkv, w_out, x)


def gqa(w_qkv, w_out, x):
    return SelfAttention(GQA)(w_qkv, w_out, x)


def _inputs(cfg):
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((cfg.d_model, cfg.q_width + 2 * cfg.kv_width), f32),
            jax.ShapeDtypeStruct((cfg.q_width, cfg.d_model), f32),
            jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.d_model), f32))


def mha_inputs():
    return _inputs(MHA)


def gqa_inputs():
    return _inputs(GQA)


class TensorParallelAttention(SelfAttention):
    """Heads split over the `model` axis; the fused weight is viewed as [d, 3, heads, head_dim]."""

    def __init__(self, cfg: AttnConfig, tp: int):
        super().__init__(dataclasses.replace(cfg, n_heads=cfg.n_heads // tp,
                                             n_kv_heads=cfg.n_kv_heads // tp))

    def local(self, w_qkv_local, w_out_local, x):
        cfg = self.cfg
        d = w_qkv_local.shape[0]
        fused = x @ w_qkv_local.reshape(d, 3 * cfg.n_heads * cfg.head_dim)
        fused = fused.reshape(cfg.batch, cfg.seq, 3, cfg.n_heads, cfg.head_dim)
        q, k, v = fused[:, :, 0], fused[:, :, 1], fused[:, :, 2]
        ctx = self.scores(q, k, v).reshape(cfg.batch, cfg.seq, cfg.q_width)
        return lax.psum(ctx @ w_out_local, "model")

    def local_v2(self, w_qkv_local, w_out_local, x):
        cfg = self.cfg
        d = w_qkv_local.shape[0]
        fused = x @ w_qkv_local.reshape(d, 3 * cfg.n_heads * cfg.head_dim)
        fused = fused.reshape(cfg.batch, cfg.seq, cfg.n_heads, 3, cfg.head_dim)
        q, k, v = fused[:, :, :, 0], fused[:, :, :, 1], fused[:, :, :, 2]
        ctx = self.scores(q, k, v).reshape(cfg.batch, cfg.seq, cfg.q_width)
        return lax.psum(ctx @ w_out_local, "model")


def _mha_tp(w_qkv, w_out, x, mesh, method):
    tp = mesh.shape["model"]
    layer = TensorParallelAttention(MHA, tp)
    w4 = w_qkv.reshape(MHA.d_model, 3, MHA.n_heads, MHA.head_dim)
    run = jax.shard_map(getattr(layer, method), mesh=mesh,
                        in_specs=(P(None, None, "model", None), P("model", None), P()),
                        out_specs=P())
    return run(w4, w_out, x)


def mha_tp(w_qkv, w_out, x, mesh):
    return _mha_tp(w_qkv, w_out, x, mesh, "local")


def mha_tp_v2(w_qkv, w_out, x, mesh):
    return _mha_tp(w_qkv, w_out, x, mesh, "local_v2")


def _gqa_replicated_kv(w_qkv, w_out, x, mesh, kv_rank):
    """tp (4) > n_kv_heads (2): query heads are sharded, each rank slices the one KV head its
    query head reads from the replicated K/V columns."""
    cfg = GQA
    tp = mesh.shape["model"]
    w_q = w_qkv[:, :cfg.q_width]
    w_kv = w_qkv[:, cfg.q_width:].reshape(cfg.d_model, 2, cfg.n_kv_heads, cfg.head_dim)

    def local(w_q_local, w_kv_all, w_out_local, tokens):
        heads = cfg.n_heads // tp
        kv_head = kv_rank(lax.axis_index("model"), tp)
        w_kv_mine = lax.dynamic_index_in_dim(w_kv_all, kv_head, axis=2, keepdims=False)
        q = (tokens @ w_q_local).reshape(cfg.batch, cfg.seq, heads, cfg.head_dim)
        kv = jnp.einsum("bsd,dte->bste", tokens, w_kv_mine)
        k = jnp.repeat(kv[:, :, :1], heads, axis=2)
        v = jnp.repeat(kv[:, :, 1:], heads, axis=2)
        ctx = SelfAttention(cfg).scores(q, k, v).reshape(cfg.batch, cfg.seq, heads * cfg.head_dim)
        return lax.psum(ctx @ w_out_local, "model")

    run = jax.shard_map(local, mesh=mesh,
                        in_specs=(P(None, "model"), P(), P("model", None), P()), out_specs=P())
    return run(w_q, w_kv, w_out, x)


def gqa_tp(w_qkv, w_out, x, mesh):
    return _gqa_replicated_kv(w_qkv, w_out, x, mesh,
                              lambda rank, tp: rank // (tp // GQA.n_kv_heads))


def gqa_tp_v2(w_qkv, w_out, x, mesh):
    return _gqa_replicated_kv(w_qkv, w_out, x, mesh,
                              lambda rank, tp: rank % GQA.n_kv_heads)
