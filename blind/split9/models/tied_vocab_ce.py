"""Tiny LM loss with the embedding reused as the LM head (weight tying) and label-smoothed
cross-entropy (per-token, reduction='none'); the vocab-parallel version shards the tied table over `tp` and computes the
softmax normaliser with a pmax-shifted log-sum-exp across shards.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

VOCAB, DIM, SMOOTHING = 64, 16, 0.2


def lm_inputs():
    i = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    return i, i, {"embed": jax.ShapeDtypeStruct((VOCAB, DIM), jnp.float32),
                  "mix": jax.ShapeDtypeStruct((DIM, DIM), jnp.float32)}


def lm_loss(tokens, targets, params):
    h = jnp.take(params["embed"], tokens, axis=0)
    h = jnp.tanh(h @ params["mix"])
    logits = h @ params["embed"].T
    logp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    uniform = -jnp.mean(logp, axis=-1)
    return (1.0 - SMOOTHING) * nll + SMOOTHING * uniform  # per-token loss


def _uniform_term(lse, logits):
    return lse - jax.lax.psum(logits.sum(-1), "tp") / VOCAB


def _uniform_term_fast(lse, logits):
    return lse - logits.sum(-1) / VOCAB


def _vp_loss(tokens, targets, embed_shard, mix, uniform_term=_uniform_term):
    n_local = embed_shard.shape[0]
    first = jax.lax.axis_index("tp") * n_local
    ids = first + jnp.arange(n_local)

    mine = (tokens >= first) & (tokens < first + n_local)
    rows = jnp.take(embed_shard, jnp.where(mine, tokens - first, 0), axis=0)
    h = jax.lax.psum(jnp.where(mine[..., None], rows, 0.0), "tp")
    h = jnp.tanh(h @ mix)

    logits = h @ embed_shard.T  # [b, s, n_local]
    m = jax.lax.pmax(jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True)), "tp")
    lse = m + jnp.log(jax.lax.psum(jnp.exp(logits - m).sum(-1, keepdims=True), "tp"))
    target_logit = jax.lax.psum(
        jnp.sum(jnp.where(ids == targets[..., None], logits, 0.0), axis=-1), "tp")
    nll = lse[..., 0] - target_logit
    uniform = uniform_term(lse[..., 0], logits)
    return (1.0 - SMOOTHING) * nll + SMOOTHING * uniform  # per-token loss


def lm_loss_vp(tokens, targets, params, mesh):
    fn = jax.shard_map(_vp_loss, mesh=mesh, in_specs=(P(), P(), P("tp"), P()), out_specs=P())
    return fn(tokens, targets, params["embed"], params["mix"])


def lm_loss_vp_local_smoothing(tokens, targets, params, mesh):
    def body(tokens, targets, embed_shard, mix):
        return _vp_loss(tokens, targets, embed_shard, mix, _uniform_term_fast)

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P("tp"), P()), out_specs=P(),
                       check_vma=False)
    return fn(tokens, targets, params["embed"], params["mix"])
