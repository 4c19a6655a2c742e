"""Vocabulary-parallel language-model losses over an untied output head [D, V] (V = 64), logits
computed from final hidden states normalised by an RMSNorm.

1. Label-smoothed cross-entropy (smoothing 0.1), per token (the trainer weights and averages it):
   (1 - eps) * (lse - z_y) + eps * (lse - mean_v z_v). On {data: 2, vocab: 4}: head columns over
   vocab, batch over data; max / sum-exp / target logit / logit sum all reduced over vocab.
2. Masked cross-entropy + z-loss (1e-4 * lse^2) averaged over the tokens whose `loss_mask` is set
   (padding excluded). On {data: 4, vocab: 2}: the target logit read with `take_along_axis` at the
   clipped local id and masked; the token mean as a global masked sum over a global token count.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, V = 4, 8, 32, 64
SMOOTH = 0.1
Z_LOSS = 1e-4
EPS = 1e-6


def _rms(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + EPS) * g


def smoothed_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(B, S, D), f(D), f(D, V), jax.ShapeDtypeStruct((B, S), jnp.int32)


def smoothed_xent(h, g, w, labels):
    logits = _rms(h, g) @ w
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return (1 - SMOOTH) * (lse - target) + SMOOTH * (lse - logits.mean(-1))


def _vocab_stats(logits, labels):
    """lse, target logit, and sum of logits over the full vocabulary from a vocab shard."""
    vl = logits.shape[-1]
    start = lax.axis_index("vocab") * vl
    m = lax.pmax(jnp.max(logits, -1), "vocab")
    lse = jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), -1), "vocab")) + m
    local = labels - start
    mine = (local >= 0) & (local < vl)
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, vl - 1)[..., None], -1)[..., 0]
    target = lax.psum(jnp.where(mine, picked, 0.0), "vocab")
    return lse, target


def smoothed_xent_vp(h, g, w, labels, mesh):
    def local(h, g, w, labels):
        logits = _rms(h, g) @ w
        lse, target = _vocab_stats(logits, labels)
        mean_logit = lax.psum(jnp.sum(logits, -1), "vocab") / V
        return (1 - SMOOTH) * (lse - target) + SMOOTH * (lse - mean_logit)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P(), P(None, "vocab"), P("data")),
                         out_specs=P("data"), check_vma=False)(h, g, w, labels)


def smoothed_xent_vp_local_mean(h, g, w, labels, mesh):
    def local(h, g, w, labels):
        logits = _rms(h, g) @ w
        lse, target = _vocab_stats(logits, labels)
        mean_logit = lax.psum(jnp.mean(logits, -1), "vocab")
        return (1 - SMOOTH) * (lse - target) + SMOOTH * (lse - mean_logit)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P(), P(None, "vocab"), P("data")),
                         out_specs=P("data"), check_vma=False)(h, g, w, labels)


# ---- masked cross-entropy + z-loss -----------------------------------------------------------------

def masked_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return (f(B, S, D), f(D), f(D, V), jax.ShapeDtypeStruct((B, S), jnp.int32),
            jax.ShapeDtypeStruct((B, S), jnp.bool_))


def masked_xent(h, g, w, labels, loss_mask):
    logits = _rms(h, g) @ w
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    per_token = lse - target + Z_LOSS * lse ** 2
    return jnp.sum(jnp.where(loss_mask, per_token, 0.0)) / jnp.maximum(jnp.sum(loss_mask), 1)


def masked_xent_vp(h, g, w, labels, loss_mask, mesh):
    def local(h, g, w, labels, loss_mask):
        lse, target = _vocab_stats(_rms(h, g) @ w, labels)
        per_token = lse - target + Z_LOSS * lse ** 2
        total = lax.psum(jnp.sum(jnp.where(loss_mask, per_token, 0.0)), "data")
        count = lax.psum(jnp.sum(loss_mask.astype(jnp.int32)), "data")
        return total / jnp.maximum(count, 1)
    specs = (P("data"), P(), P(None, "vocab"), P("data"), P("data"))
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(
        h, g, w, labels, loss_mask)


def masked_xent_vp_mean_of_means(h, g, w, labels, loss_mask, mesh):
    def local(h, g, w, labels, loss_mask):
        lse, target = _vocab_stats(_rms(h, g) @ w, labels)
        per_token = lse - target + Z_LOSS * lse ** 2
        local_mean = jnp.sum(jnp.where(loss_mask, per_token, 0.0)) / jnp.maximum(jnp.sum(loss_mask), 1)
        return lax.pmean(local_mean, "data")
    specs = (P("data"), P(), P(None, "vocab"), P("data"), P("data"))
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(
        h, g, w, labels, loss_mask)
