"""Tied-embedding language-model head with a vocabulary-parallel table.

The "model" is embed -> RMSNorm -> tied logits (h @ table.T) -> token cross-entropy.

1. {vocab: 4}: masked lookup (rows outside the local range zeroed, psum), vocabulary-parallel
   logsumexp (pmax / psum) and target-logit gather; returns the per-token loss and its mean.
2. {data: 2, vocab: 2}: the lookup written as a one-hot matmul against the local rows, label-smoothed
   cross-entropy (the smoothing term needs the mean logit over the whole vocabulary), batch over
   `data`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, V, D = 4, 8, 64, 16
SMOOTHING = 0.1


def lm_inputs():
    return ({"table": jax.ShapeDtypeStruct((V, D), jnp.float32),
             "norm": jax.ShapeDtypeStruct((D,), jnp.float32)},
            jax.ShapeDtypeStruct((B, T), jnp.int32), jax.ShapeDtypeStruct((B, T), jnp.int32))


def _norm(e, w):
    return e * lax.rsqrt(jnp.mean(e * e, axis=-1, keepdims=True) + 1e-6) * w


def lm_loss(params, tokens, targets):
    h = _norm(params["table"][tokens], params["norm"])
    logp = jax.nn.log_softmax(h @ params["table"].T, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return {"nll": nll, "loss": nll.mean()}


def _vocab_parallel(params, tokens, targets):
    table = params["table"]
    v_local = table.shape[0]
    start = lax.axis_index("vocab") * v_local
    owned = (tokens >= start) & (tokens < start + v_local)
    rows = jnp.take(table, jnp.clip(tokens - start, 0, v_local - 1), axis=0)
    h = _norm(lax.psum(jnp.where(owned[..., None], rows, 0.0), "vocab"), params["norm"])
    logits = h @ table.T
    m = lax.pmax(lax.stop_gradient(logits.max(axis=-1)), "vocab")
    lse = jnp.log(lax.psum(jnp.exp(logits - m[..., None]).sum(axis=-1), "vocab")) + m
    tgt_owned = (targets >= start) & (targets < start + v_local)
    tgt = jnp.take_along_axis(logits, jnp.clip(targets - start, 0, v_local - 1)[..., None], -1)[..., 0]
    nll = lse - lax.psum(jnp.where(tgt_owned, tgt, 0.0), "vocab")
    return {"nll": nll, "loss": nll.mean()}


def _vocab_parallel_owned_inclusive(params, tokens, targets):
    table = params["table"]
    v_local = table.shape[0]
    start = lax.axis_index("vocab") * v_local
    owned = (tokens >= start) & (tokens <= start + v_local)
    rows = jnp.take(table, jnp.clip(tokens - start, 0, v_local - 1), axis=0)
    h = _norm(lax.psum(jnp.where(owned[..., None], rows, 0.0), "vocab"), params["norm"])
    logits = h @ table.T
    m = lax.pmax(lax.stop_gradient(logits.max(axis=-1)), "vocab")
    lse = jnp.log(lax.psum(jnp.exp(logits - m[..., None]).sum(axis=-1), "vocab")) + m
    tgt_owned = (targets >= start) & (targets < start + v_local)
    tgt = jnp.take_along_axis(logits, jnp.clip(targets - start, 0, v_local - 1)[..., None], -1)[..., 0]
    nll = lse - lax.psum(jnp.where(tgt_owned, tgt, 0.0), "vocab")
    return {"nll": nll, "loss": nll.mean()}


def _run_vocab(body, params, tokens, targets, mesh):
    fn = jax.shard_map(body, mesh=mesh, in_specs=({"table": P("vocab"), "norm": P()}, P(), P()),
                       out_specs={"nll": P(), "loss": P()})
    return fn(params, tokens, targets)


def lm_loss_vocab_parallel(params, tokens, targets, mesh):
    return _run_vocab(_vocab_parallel, params, tokens, targets, mesh)


def lm_loss_vocab_parallel_owned_inclusive(params, tokens, targets, mesh):
    return _run_vocab(_vocab_parallel_owned_inclusive, params, tokens, targets, mesh)


# ---- one-hot lookup, label smoothing, batch over data -------------------------------------------

def smoothed_lm_loss(params, tokens, targets):
    h = _norm(jax.nn.one_hot(tokens, V) @ params["table"], params["norm"])
    logits = h @ params["table"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    smooth = -logp.mean(axis=-1)
    per_token = (1.0 - SMOOTHING) * nll + SMOOTHING * smooth
    return {"per_token": per_token, "loss": per_token.mean()}


def _smoothed_local(params, tokens, targets, total_vocab):
    table = params["table"]
    v_local = table.shape[0]
    start = lax.axis_index("vocab") * v_local
    h = _norm(lax.psum(jax.nn.one_hot(tokens - start, v_local) @ table, "vocab"), params["norm"])
    logits = h @ table.T
    m = lax.pmax(lax.stop_gradient(logits.max(axis=-1)), "vocab")
    lse = jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1), "vocab")) + m
    tgt = lax.psum(jnp.sum(jax.nn.one_hot(targets - start, v_local) * logits, axis=-1), "vocab")
    mean_logit = lax.psum(jnp.sum(logits, axis=-1), "vocab") / total_vocab
    per_token = (1.0 - SMOOTHING) * (lse - tgt) + SMOOTHING * (lse - mean_logit)
    return {"per_token": per_token, "loss": lax.pmean(per_token.mean(), "data")}


def _smoothed_local_unreduced_mean(params, tokens, targets, total_vocab):
    table = params["table"]
    v_local = table.shape[0]
    start = lax.axis_index("vocab") * v_local
    h = _norm(lax.psum(jax.nn.one_hot(tokens - start, v_local) @ table, "vocab"), params["norm"])
    logits = h @ table.T
    m = lax.pmax(lax.stop_gradient(logits.max(axis=-1)), "vocab")
    lse = jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1), "vocab")) + m
    tgt = lax.psum(jnp.sum(jax.nn.one_hot(targets - start, v_local) * logits, axis=-1), "vocab")
    mean_logit = jnp.sum(logits, axis=-1) / total_vocab
    per_token = (1.0 - SMOOTHING) * (lse - tgt) + SMOOTHING * (lse - mean_logit)
    return {"per_token": per_token, "loss": lax.pmean(per_token.mean(), "data")}


def _run_smoothed(body, params, tokens, targets, mesh):
    fn = jax.shard_map(lambda p, a, b: body(p, a, b, V), mesh=mesh,
                       in_specs=({"table": P("vocab"), "norm": P()}, P("data"), P("data")),
                       out_specs={"per_token": P("data"), "loss": P()}, check_vma=False)
    return fn(params, tokens, targets)


def smoothed_lm_loss_sharded(params, tokens, targets, mesh):
    return _run_smoothed(_smoothed_local, params, tokens, targets, mesh)


def smoothed_lm_loss_sharded_unreduced_mean(params, tokens, targets, mesh):
    return _run_smoothed(_smoothed_local_unreduced_mean, params, tokens, targets, mesh)
