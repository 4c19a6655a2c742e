"""Gemma-style language-model ends with a tied, vocabulary-parallel embedding table.

Embedding scaled by sqrt(d_model), a (1 + scale) RMSNorm, the tied output head with final-logit
soft-capping (cap * tanh(logits / cap)), cross-entropy plus a PaLM z-loss (1e-4 * lse^2). The
returned pair is (mean cross-entropy, mean z-loss).

Sharded on a 2-D mesh {data: 2, vocab: 4}: the table is row-sharded over `vocab`, the batch over
`data`. Two ways of doing the vocabulary-parallel lookups:
- `one_hot`: jax.nn.one_hot of (id - shard start) is all-zero outside the shard's range, so the
  embedding rows and target logits are one-hot contractions all-reduced over `vocab`;
- `take`: an explicit in-range mask, ids clamped into the shard and read with jnp.take /
  take_along_axis, masked, all-reduced.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, V = 4, 8, 16, 64
CAP = 30.0
Z_COEF = 1e-4


def lm_inputs():
    return (jax.ShapeDtypeStruct((V, D), jnp.float32), jax.ShapeDtypeStruct((D,), jnp.float32),
            jax.ShapeDtypeStruct((B, S), jnp.int32), jax.ShapeDtypeStruct((B, S), jnp.int32))


def _final_norm(h, scale):
    return h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * (1.0 + scale)


def _softcap(logits):
    return CAP * jnp.tanh(logits / CAP)


def lm_loss(table, norm_scale, ids, targets):
    h = _final_norm(table[ids] * jnp.sqrt(float(D)), norm_scale)
    logits = _softcap(h @ table.T)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - target_logit), Z_COEF * jnp.mean(jnp.square(lse))


def _sharded_lse(logits):
    m = lax.pmax(jnp.max(logits, axis=-1), "vocab")
    total = lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1), "vocab")
    return jnp.log(total) + m


def _shard_lse(logits):
    m = lax.pmax(jnp.max(logits, axis=-1), "vocab")
    total = jnp.sum(jnp.exp(logits - m[..., None]), axis=-1)
    return jnp.log(total) + m


def _one_hot_local(table, norm_scale, ids, targets, lse_fn):
    v_local = table.shape[0]
    start = lax.axis_index("vocab") * v_local
    emb = lax.psum(jax.nn.one_hot(ids - start, v_local) @ table, "vocab")
    h = _final_norm(emb * jnp.sqrt(float(D)), norm_scale)
    logits = _softcap(h @ table.T)
    lse = lse_fn(logits)
    target_logit = lax.psum(jnp.sum(jax.nn.one_hot(targets - start, v_local) * logits, -1), "vocab")
    ce = lax.pmean(jnp.mean(lse - target_logit), "data")
    return ce, Z_COEF * lax.pmean(jnp.mean(jnp.square(lse)), "data")


def _run(local, table, norm_scale, ids, targets, mesh):
    fn = jax.shard_map(local, mesh=mesh,
                       in_specs=(P("vocab", None), P(), P("data"), P("data")),
                       out_specs=(P(), P()), check_vma=False)
    return fn(table, norm_scale, ids, targets)


def lm_loss_one_hot(table, norm_scale, ids, targets, mesh):
    return _run(lambda *a: _one_hot_local(*a, lse_fn=_sharded_lse), table, norm_scale, ids, targets, mesh)


def lm_loss_one_hot_local_lse(table, norm_scale, ids, targets, mesh):
    return _run(lambda *a: _one_hot_local(*a, lse_fn=_shard_lse), table, norm_scale, ids, targets, mesh)


def _owned(i, start, v_local):
    return (i >= start) & (i < start + v_local)


def _owned_inclusive(i, start, v_local):
    return (i >= start) & (i <= start + v_local)


def _take_local(table, norm_scale, ids, targets, owned):
    v_local = table.shape[0]
    start = lax.axis_index("vocab") * v_local
    in_ids = owned(ids, start, v_local)
    rows = jnp.take(table, jnp.where(in_ids, ids - start, 0), axis=0, mode="clip")
    emb = lax.psum(jnp.where(in_ids[..., None], rows, 0.0), "vocab")
    h = _final_norm(emb * jnp.sqrt(float(D)), norm_scale)
    logits = _softcap(h @ table.T)
    lse = _sharded_lse(logits)
    in_tgt = owned(targets, start, v_local)
    local_tgt = jnp.where(in_tgt, targets - start, 0)
    picked = jnp.take_along_axis(logits, local_tgt[..., None], axis=-1, mode="clip")[..., 0]
    target_logit = lax.psum(jnp.where(in_tgt, picked, 0.0), "vocab")
    ce = lax.pmean(jnp.mean(lse - target_logit), "data")
    return ce, Z_COEF * lax.pmean(jnp.mean(jnp.square(lse)), "data")


def lm_loss_take(table, norm_scale, ids, targets, mesh):
    return _run(lambda *a: _take_local(*a, owned=_owned), table, norm_scale, ids, targets, mesh)


def lm_loss_take_inclusive(table, norm_scale, ids, targets, mesh):
    return _run(lambda *a: _take_local(*a, owned=_owned_inclusive), table, norm_scale, ids,
                targets, mesh)
