# Vocab-parallel softmax cross-entropy (mean over tokens) for an LM head whose output projection
# is split over the vocabulary on 'tp'. Written with lax collectives inside shard_map.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_TOK, D, V = 12, 16, 64


def xent_inputs():
    return (jax.ShapeDtypeStruct((N_TOK, D), jnp.float32),
            jax.ShapeDtypeStruct((D, V), jnp.float32),
            jax.ShapeDtypeStruct((N_TOK,), jnp.int32))


def lm_loss(h, w_out, labels):
    logits = h @ w_out
    logz = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(logz - target)


def lm_loss_vocab_parallel(h, w_out, labels):
    def local_loss(h, w_shard, labels):
        v_local = w_shard.shape[1]
        first = lax.axis_index("tp") * v_local
        logits = h @ w_shard
        m = lax.pmax(jnp.max(logits, axis=-1), "tp")
        sumexp = lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp")
        idx = labels - first
        mine = (idx >= 0) & (idx < v_local)
        picked = jnp.take_along_axis(logits, jnp.clip(idx, 0, v_local - 1)[:, None], axis=-1)[:, 0]
        target = lax.psum(jnp.where(mine, picked, 0.0), "tp")
        return jnp.mean(jnp.log(sumexp) + m - target)

    return jax.shard_map(local_loss, in_specs=(P(), P(None, "tp"), P()), out_specs=P(),
                         check_vma=False)(h, w_out, labels)


def lm_loss_vocab_parallel_bad_offset(h, w_out, labels):
    def local_loss(h, w_shard, labels):
        v_local = w_shard.shape[1]
        first = lax.axis_index("tp")
        logits = h @ w_shard
        m = lax.pmax(jnp.max(logits, axis=-1), "tp")
        sumexp = lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp")
        idx = labels - first
        mine = (idx >= 0) & (idx < v_local)
        picked = jnp.take_along_axis(logits, jnp.clip(idx, 0, v_local - 1)[:, None], axis=-1)[:, 0]
        target = lax.psum(jnp.where(mine, picked, 0.0), "tp")
        return jnp.mean(jnp.log(sumexp) + m - target)

    return jax.shard_map(local_loss, in_specs=(P(), P(None, "tp"), P()), out_specs=P(),
                         check_vma=False)(h, w_out, labels)
