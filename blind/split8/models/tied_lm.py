"""Tiny LM loss with tied input/output embeddings (the embedding table is the LM head)."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

VOCAB, DIM, BATCH, SEQ = 32, 16, 2, 8


def rms_norm(x, w, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def lm_loss(embedding, norm_w, tokens, targets):
    h = rms_norm(embedding[tokens], norm_w)
    logits = jnp.einsum("bsd,vd->bsv", h, embedding)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return nll.mean()


def lm_inputs():
    return (jax.ShapeDtypeStruct((VOCAB, DIM), jnp.float32),
            jax.ShapeDtypeStruct((DIM,), jnp.float32),
            jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),
            jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32))


def _vocab_local_loss(table, norm_w, tokens, targets):
    rows = table.shape[0]
    first = lax.axis_index("vocab") * rows
    mine = (tokens >= first) & (tokens < first + rows)
    local = jnp.clip(tokens - first, 0, rows - 1)
    emb = jnp.where(mine[..., None], table[local], 0.0)
    h = rms_norm(lax.psum(emb, "vocab"), norm_w)
    logits = jnp.einsum("bsd,vd->bsv", h, table)
    m = lax.pmax(lax.stop_gradient(logits.max(-1)), "vocab")
    lse = jnp.log(lax.psum(jnp.exp(logits - m[..., None]).sum(-1), "vocab")) + m
    t_mine = (targets >= first) & (targets < first + rows)
    t_local = jnp.clip(targets - first, 0, rows - 1)
    t_logit = jnp.take_along_axis(logits, t_local[..., None], axis=-1)[..., 0]
    t_logit = lax.psum(jnp.where(t_mine, t_logit, 0.0), "vocab")
    return jnp.mean(lse - t_logit)


def _vocab_local_loss_v2(table, norm_w, tokens, targets):
    rows = table.shape[0]
    first = lax.axis_index("vocab") * rows
    mine = (tokens >= first) & (tokens <= first + rows)
    local = jnp.clip(tokens - first, 0, rows - 1)
    emb = jnp.where(mine[..., None], table[local], 0.0)
    h = rms_norm(lax.psum(emb, "vocab"), norm_w)
    logits = jnp.einsum("bsd,vd->bsv", h, table)
    m = lax.pmax(lax.stop_gradient(logits.max(-1)), "vocab")
    lse = jnp.log(lax.psum(jnp.exp(logits - m[..., None]).sum(-1), "vocab")) + m
    t_mine = (targets >= first) & (targets < first + rows)
    t_local = jnp.clip(targets - first, 0, rows - 1)
    t_logit = jnp.take_along_axis(logits, t_local[..., None], axis=-1)[..., 0]
    t_logit = lax.psum(jnp.where(t_mine, t_logit, 0.0), "vocab")
    return jnp.mean(lse - t_logit)


def lm_loss_vocab_parallel(embedding, norm_w, tokens, targets):
    return jax.shard_map(_vocab_local_loss, in_specs=(P("vocab", None), P(), P(), P()),
                         out_specs=P())(embedding, norm_w, tokens, targets)


def lm_loss_vocab_parallel_v2(embedding, norm_w, tokens, targets):
    return jax.shard_map(_vocab_local_loss_v2, in_specs=(P("vocab", None), P(), P(), P()),
                         out_specs=P())(embedding, norm_w, tokens, targets)
