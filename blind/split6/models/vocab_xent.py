"""LM head + softmax cross-entropy with the vocabulary sharded (Megatron vocab-parallel loss)."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

TOKENS, HIDDEN, VOCAB, SHARDS = 12, 8, 32, 4


def lm_loss(h, w_vocab, labels):
    logits = h @ w_vocab
    lse = jax.scipy.special.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(lse - picked)


PER_SHARD = VOCAB // SHARDS


def _target_logit(logits, labels):
    offset = labels - lax.axis_index("vocab") * PER_SHARD
    inside = (offset >= 0) & (offset < PER_SHARD)
    safe = jnp.clip(offset, 0, PER_SHARD - 1)
    mine = jnp.take_along_axis(logits, safe[:, None], axis=-1)[:, 0]
    return lax.psum(jnp.where(inside, mine, 0.0), "vocab")


def _xent_shard(h, w_cols, labels):
    logits = h @ w_cols                                        # [T, V/n]
    m = lax.pmax(jnp.max(logits, axis=-1), "vocab")
    sumexp = lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "vocab")
    return jnp.mean(jnp.log(sumexp) + m - _target_logit(logits, labels))


def _xent_shard_v2(h, w_cols, labels):
    logits = h @ w_cols
    m = lax.pmax(jnp.max(logits, axis=-1), "vocab")
    sumexp = jnp.sum(jnp.exp(logits - m[:, None]), axis=-1)
    return jnp.mean(jnp.log(sumexp) + m - _target_logit(logits, labels))


def lm_loss_vocab_parallel(h, w_vocab, labels):
    return jax.shard_map(_xent_shard, in_specs=(P(), P(None, "vocab"), P()), out_specs=P(),
                         check_vma=False)(h, w_vocab, labels)


def lm_loss_vocab_parallel_local_sumexp(h, w_vocab, labels):
    return jax.shard_map(_xent_shard_v2, in_specs=(P(), P(None, "vocab"), P()), out_specs=P(),
                         check_vma=False)(h, w_vocab, labels)


def lm_loss_jit(h, w_vocab, labels, mesh):
    """The same loss left to the SPMD partitioner: only the weight and logits layouts are pinned."""
    w_vocab = lax.with_sharding_constraint(w_vocab, NamedSharding(mesh, P(None, "vocab")))
    logits = lax.with_sharding_constraint(h @ w_vocab, NamedSharding(mesh, P(None, "vocab")))
    lse = jax.nn.logsumexp(logits, axis=-1)
    onehot = jax.nn.one_hot(labels, VOCAB, dtype=logits.dtype)
    return jnp.mean(lse - jnp.sum(logits * onehot, axis=-1))


def inputs():
    return (jax.ShapeDtypeStruct((TOKENS, HIDDEN), jnp.float32),
            jax.ShapeDtypeStruct((HIDDEN, VOCAB), jnp.float32),
            jax.ShapeDtypeStruct((TOKENS,), jnp.int32))
