"""Token losses over a vocabulary-sharded LM head.

Focal loss (gamma = 2): mean over tokens of -(1 - p_t)^2 log p_t, p_t the softmax probability of
the label. `focal_tp`: shard_map on {tp: 4}; head columns over tp, log-sum-exp from a pmax'd max
and a psum'd sum, the label logit picked by the rank owning it and psum'd.

Masked tempered log-likelihood: sum over non-pad tokens (label != 0) of log softmax(logits / TEMP)
at the label, divided by the number of non-pad tokens. `tempered_ll_jit`: jit on {dp: 2, tp: 2},
logits constrained to (dp, -, tp).
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, T, D, V = 4, 16, 16, 64
NT = 4
VL = V // NT
TEMP = 0.7


def inputs():
    return (jax.ShapeDtypeStruct((D, V), jnp.float32), jax.ShapeDtypeStruct((B, T, D), jnp.float32),
            jax.ShapeDtypeStruct((B, T), jnp.int32))


def _logits(w, h):
    return h @ w / math.sqrt(D)


def focal(w, h, labels):
    logp = jax.nn.log_softmax(_logits(w, h), -1)
    lt = jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]
    return jnp.mean(-((1.0 - jnp.exp(lt)) ** 2) * lt)


def _focal_local(w, h, labels, upper):
    logits = _logits(w, h)
    m = lax.pmax(jnp.max(logits, -1), "tp")
    lse = m + jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), -1), "tp"))
    local = labels - lax.axis_index("tp") * VL
    mine = (local >= 0) & (local < upper)
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, VL - 1)[..., None], -1)[..., 0]
    lt = lax.psum(jnp.where(mine, picked, 0.0), "tp") - lse
    return jnp.mean(-((1.0 - jnp.exp(lt)) ** 2) * lt)


def _focal_run(upper, w, h, labels, mesh):
    return jax.shard_map(lambda w, h, l: _focal_local(w, h, l, upper), mesh=mesh,
                         in_specs=(P(None, "tp"), P(), P()), out_specs=P(), check_vma=False)(w, h, labels)


def focal_tp(w, h, labels, mesh):
    return _focal_run(VL, w, h, labels, mesh)


def focal_tp_label_window_overlaps(w, h, labels, mesh):
    return _focal_run(VL + 1, w, h, labels, mesh)


def tempered_ll(w, h, labels):
    z = _logits(w, h) / TEMP
    lt = jnp.take_along_axis(z, labels[..., None], -1)[..., 0] - jax.nn.logsumexp(z, -1)
    keep = (labels != 0).astype(jnp.float32)
    return jnp.sum(lt * keep) / jnp.sum(keep)


def _tempered_jit(w, h, labels, mesh, target_temp):
    logits = lax.with_sharding_constraint(_logits(w, h), NamedSharding(mesh, P("dp", None, "tp")))
    target = jnp.take_along_axis(logits, labels[..., None], -1)[..., 0] / target_temp
    lt = target - jax.nn.logsumexp(logits / TEMP, -1)
    keep = (labels != 0).astype(jnp.float32)
    return jnp.sum(lt * keep) / jnp.sum(keep)


def tempered_ll_jit(w, h, labels, mesh):
    return jax.jit(lambda w, h, l: _tempered_jit(w, h, l, mesh, TEMP))(w, h, labels)


def tempered_ll_jit_target_untempered(w, h, labels, mesh):
    return jax.jit(lambda w, h, l: _tempered_jit(w, h, l, mesh, 1.0))(w, h, labels)
