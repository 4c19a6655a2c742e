# Mean token cross-entropy with the LM head split over the vocabulary (Megatron vocab-parallel).
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_TOK, D_MODEL, N_VOCAB = 6, 16, 32


def make_inputs():
    return (jax.ShapeDtypeStruct((N_TOK, D_MODEL), jnp.float32),
            jax.ShapeDtypeStruct((D_MODEL, N_VOCAB), jnp.float32),
            jax.ShapeDtypeStruct((N_TOK,), jnp.int32))


def xent(hidden, lm_head, labels):
    logits = hidden @ lm_head
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(lse - picked)


def _xent_shard(hidden, head_cols, labels, start_fn):
    local_logits = hidden @ head_cols                       # [N_TOK, V/n]
    gmax = lax.pmax(jnp.max(local_logits, axis=-1), "vp")
    sumexp = lax.psum(jnp.sum(jnp.exp(local_logits - gmax[:, None]), axis=-1), "vp")
    lse = jnp.log(sumexp) + gmax
    start = start_fn(lax.axis_index("vp"), local_logits)
    rel = labels - start
    here = (rel >= 0) & (rel < local_logits.shape[-1])
    picked = jnp.take_along_axis(local_logits, jnp.clip(rel, 0, local_logits.shape[-1] - 1)[:, None],
                                 axis=-1)[:, 0]
    picked = lax.psum(jnp.where(here, picked, 0.0), "vp")
    return jnp.mean(lse - picked)


def xent_vocab_parallel(hidden, lm_head, labels, mesh):
    def start_fn(dev, local_logits):
        return dev * local_logits.shape[-1]

    fn = lambda h, w, y: _xent_shard(h, w, y, start_fn)  # noqa: E731
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(None, "vp"), P()), out_specs=P())(
        hidden, lm_head, labels)


def xent_vocab_parallel_offset(hidden, lm_head, labels, mesh):
    def start_fn(dev, local_logits):
        return dev * local_logits.shape[0]

    fn = lambda h, w, y: _xent_shard(h, w, y, start_fn)  # noqa: E731
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(None, "vp"), P()), out_specs=P())(
        hidden, lm_head, labels)
