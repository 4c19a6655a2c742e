"""Embedding lookup + untied LM head + mean token cross-entropy, with a dataclass config and the
per-shard helpers bound with `functools.partial`. The vocabulary (embedding rows and LM-head
columns) is sharded over `vp`, the batch over `dp`, on a {dp: 2, vp: 4} mesh.

- `loss_masked_take`: Megatron-style masked lookup (`jnp.take` at `token - start`, zeroed outside
  the shard's range), logsumexp from a `pmax` / `psum`, the target logit masked and `psum`-reduced,
  the batch mean by `pmean` over dp;
- `loss_one_hot`: lookup and target logit as one-hot contractions against `token - start` (a
  one-hot of an out-of-range index is all zeros), the mean as a global sum / global token count.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 64
    d_model: int = 32
    batch: int = 4
    seq: int = 8
    vocab_axis: str = "vp"
    batch_axis: str = "dp"
    vocab_shards: int = 4


CFG = Config()


def lm_inputs():
    c = CFG
    return ({"embed": jax.ShapeDtypeStruct((c.vocab, c.d_model), jnp.float32),
             "mix": jax.ShapeDtypeStruct((c.d_model, c.d_model), jnp.float32),
             "head": jax.ShapeDtypeStruct((c.d_model, c.vocab), jnp.float32)},
            jax.ShapeDtypeStruct((c.batch, c.seq), jnp.int32),
            jax.ShapeDtypeStruct((c.batch, c.seq), jnp.int32))


def _hidden(e, mix):
    return jnp.tanh(e @ mix) + e


def lm_loss(params, tokens, labels):
    h = _hidden(jnp.take(params["embed"], tokens, axis=0), params["mix"])
    logits = h @ params["head"]
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - tgt)


# ---- masked take ------------------------------------------------------------------------------

def _shard_range(cfg):
    v_local = cfg.vocab // cfg.vocab_shards
    start = lax.axis_index(cfg.vocab_axis) * v_local
    return start, v_local


def _masked_lookup(table, ids, cfg):
    start, v_local = _shard_range(cfg)
    ok = (ids >= start) & (ids < start + v_local)
    rows = jnp.take(table, jnp.where(ok, ids - start, 0), axis=0)
    return lax.psum(jnp.where(ok[..., None], rows, 0.0), cfg.vocab_axis)


def _masked_lookup_inclusive(table, ids, cfg):
    start, v_local = _shard_range(cfg)
    ok = (ids >= start) & (ids <= start + v_local)
    rows = jnp.take(table, jnp.where(ok, ids - start, 0), axis=0)
    return lax.psum(jnp.where(ok[..., None], rows, 0.0), cfg.vocab_axis)


def _masked_target(logits, labels, cfg):
    start, v_local = _shard_range(cfg)
    ok = (labels >= start) & (labels < start + v_local)
    local = jnp.take_along_axis(logits, jnp.where(ok, labels - start, 0)[..., None], axis=-1)[..., 0]
    return lax.psum(jnp.where(ok, local, 0.0), cfg.vocab_axis)


def _sharded_lse(logits, cfg):
    m = lax.pmax(jnp.max(logits, axis=-1), cfg.vocab_axis)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1), cfg.vocab_axis)) + m


def _masked_local(lookup, params, tokens, labels, cfg):
    h = _hidden(lookup(params["embed"], tokens), params["mix"])
    logits = h @ params["head"]
    nll = _sharded_lse(logits, cfg) - _masked_target(logits, labels, cfg)
    return lax.pmean(jnp.mean(nll), cfg.batch_axis)


def _run(local, params, tokens, labels, mesh, cfg=CFG):
    specs = {"embed": P(cfg.vocab_axis), "mix": P(), "head": P(None, cfg.vocab_axis)}
    data = P(cfg.batch_axis)
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, data, data),
                         out_specs=P())(params, tokens, labels)


def loss_masked_take(params, tokens, labels, mesh):
    local = functools.partial(_masked_local, functools.partial(_masked_lookup, cfg=CFG), cfg=CFG)
    return _run(local, params, tokens, labels, mesh)


def loss_masked_take_inclusive(params, tokens, labels, mesh):
    local = functools.partial(_masked_local, functools.partial(_masked_lookup_inclusive, cfg=CFG),
                              cfg=CFG)
    return _run(local, params, tokens, labels, mesh)


# ---- one-hot contractions ---------------------------------------------------------------------

def _one_hot_local(params, tokens, labels, cfg, global_count):
    start, v_local = _shard_range(cfg)
    e = lax.psum(jax.nn.one_hot(tokens - start, v_local) @ params["embed"], cfg.vocab_axis)
    logits = _hidden(e, params["mix"]) @ params["head"]
    tgt = lax.psum(jnp.sum(jax.nn.one_hot(labels - start, v_local) * logits, -1), cfg.vocab_axis)
    nll = _sharded_lse(logits, cfg) - tgt
    count = nll.size * lax.psum(1, cfg.batch_axis) if global_count else nll.size
    return lax.psum(jnp.sum(nll), cfg.batch_axis) / count


def loss_one_hot(params, tokens, labels, mesh):
    local = functools.partial(_one_hot_local, cfg=CFG, global_count=True)
    return _run(local, params, tokens, labels, mesh)


def loss_one_hot_local_count(params, tokens, labels, mesh):
    local = functools.partial(_one_hot_local, cfg=CFG, global_count=False)
    return _run(local, params, tokens, labels, mesh)
