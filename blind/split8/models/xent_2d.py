"""Per-token cross-entropy of logits split over tokens (dp) and over the vocabulary (tp)."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_TOK, N_VOCAB = 8, 32


def token_xent(logits, labels):
    lse = jax.scipy.special.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
    return lse - picked


def xent_inputs():
    return (jax.ShapeDtypeStruct((N_TOK, N_VOCAB), jnp.float32),
            jax.ShapeDtypeStruct((N_TOK,), jnp.int32))


def _local_xent(block, labels, combine):
    width = block.shape[1]
    lo = lax.axis_index("tp") * width
    gmax = lax.pmax(block.max(axis=1), "tp")
    sumexp = combine(jnp.exp(block - gmax[:, None]).sum(axis=1), "tp")
    col = jnp.arange(width)[None, :] + lo
    hit = col == labels[:, None]
    picked = lax.psum(jnp.sum(jnp.where(hit, block, 0.0), axis=1), "tp")
    return jnp.log(sumexp) + gmax - picked


def token_xent_sharded(logits, labels):
    fn = jax.shard_map(lambda b, y: _local_xent(b, y, lax.psum),
                       in_specs=(P("dp", "tp"), P("dp")), out_specs=P("dp"))
    return fn(logits, labels)


def token_xent_sharded_v2(logits, labels):
    fn = jax.shard_map(lambda b, y: _local_xent(b, y, lax.pmean),
                       in_specs=(P("dp", "tp"), P("dp")), out_specs=P("dp"))
    return fn(logits, labels)
