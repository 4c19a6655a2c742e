"""LM head loss with label smoothing and a z-loss, sharded by jit alone.

The hidden states are batch-sharded over 'data' and the unembedding is vocab-sharded over
'model' through sharding constraints; XLA inserts the collectives.
"""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BS, SEQ, DM, VOCAB = 4, 4, 16, 48
SMOOTH, Z_COEF = 0.1, 1e-3


def head_inputs():
    return (jax.ShapeDtypeStruct((BS, SEQ, DM), jnp.float32),
            jax.ShapeDtypeStruct((DM, VOCAB), jnp.float32),
            jax.ShapeDtypeStruct((BS, SEQ), jnp.int32))


def smoothed_loss(hidden, unembed, targets):
    logits = jnp.einsum("bsd,dv->bsv", hidden, unembed)
    logz = jax.nn.logsumexp(logits, axis=-1)
    logp = logits - logz[..., None]
    onehot = jax.nn.one_hot(targets, VOCAB)
    soft = onehot * (1.0 - SMOOTH) + SMOOTH / VOCAB
    nll = -jnp.sum(soft * logp, axis=-1)
    return jnp.mean(nll + Z_COEF * jnp.square(logz))


def smoothed_loss_sharded(hidden, unembed, targets, mesh):
    hidden = jax.lax.with_sharding_constraint(hidden, NamedSharding(mesh, P("data")))
    unembed = jax.lax.with_sharding_constraint(unembed, NamedSharding(mesh, P(None, "model")))
    logits = jnp.einsum("bsd,dv->bsv", hidden, unembed)
    logits = jax.lax.with_sharding_constraint(logits, NamedSharding(mesh, P("data", None, "model")))
    return smoothed_loss_from_logits(logits, targets)


def smoothed_loss_from_logits(logits, targets):
    logz = jax.nn.logsumexp(logits, axis=-1)
    logp = logits - logz[..., None]
    onehot = jax.nn.one_hot(targets, VOCAB)
    soft = onehot * (1.0 - SMOOTH) + SMOOTH / VOCAB
    nll = -jnp.sum(soft * logp, axis=-1)
    return jnp.mean(nll + Z_COEF * jnp.square(logz))
