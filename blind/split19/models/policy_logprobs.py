"""Policy-gradient bookkeeping over a tied, soft-capped LM head (Gemma-2 style
`cap * tanh(logits / cap)`): per-token log-probability of the sampled tokens and the entropy of
the next-token distribution, as RL fine-tuning code (PPO/GRPO) computes them.

- `logprobs_vocab_shards`: on {tp: 4}, the embedding's vocabulary rows over tp; log-partition by
  pmax + psum, the sampled token picked on the shard that owns it (offset by axis_index), the
  entropy's E[logit] term summed over shards;
- `logprobs_jit`: on {data: 2, vocab: 2}, plain jit code with `with_sharding_constraint` on the
  logits (batch over data, vocabulary over vocab); the partitioner inserts the collectives.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, T, D, V, CAP = 2, 8, 16, 64, 5.0


def inputs():
    return (jax.ShapeDtypeStruct((B, T, D), jnp.float32), jax.ShapeDtypeStruct((V, D), jnp.float32),
            jax.ShapeDtypeStruct((B, T), jnp.int32))


def soft_cap(z):
    return CAP * jnp.tanh(z / CAP)


def logprobs_and_entropy(h, emb, tokens):
    logits = soft_cap(jnp.einsum("btd,vd->btv", h, emb))
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
    probs = jax.nn.softmax(logits, axis=-1)
    return picked - lse, lse - jnp.sum(probs * logits, axis=-1)


# ---- vocabulary rows over tp --------------------------------------------------------------------

def _shard_start(v_local):
    return lax.axis_index("tp") * v_local


def _shard_start_global_stride(v_local):
    return lax.axis_index("tp") * V


def _local(h, emb, tokens, start):
    logits = soft_cap(jnp.einsum("btd,vd->btv", h, emb))
    v_local = logits.shape[-1]
    m = lax.pmax(jnp.max(logits, axis=-1), "tp")
    lse = m + jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1), "tp"))
    local_ids = tokens - start(v_local)
    mine = (local_ids >= 0) & (local_ids < v_local)
    got = jnp.take_along_axis(logits, jnp.clip(local_ids, 0, v_local - 1)[..., None], axis=-1)[..., 0]
    picked = lax.psum(jnp.where(mine, got, 0.0), "tp")
    mean_logit = lax.psum(jnp.sum(jnp.exp(logits - lse[..., None]) * logits, axis=-1), "tp")
    return picked - lse, lse - mean_logit


def _vocab_sharded(h, emb, tokens, mesh, start):
    return jax.shard_map(lambda h, e, t: _local(h, e, t, start), mesh=mesh,
                         in_specs=(P(), P("tp", None), P()), out_specs=(P(), P()),
                         check_vma=False)(h, emb, tokens)


def logprobs_vocab_shards(h, emb, tokens, mesh):
    return _vocab_sharded(h, emb, tokens, mesh, _shard_start)


def logprobs_vocab_shards_global_offset(h, emb, tokens, mesh):
    return _vocab_sharded(h, emb, tokens, mesh, _shard_start_global_stride)


# ---- jit with sharding constraints --------------------------------------------------------------

def logprobs_jit(h, emb, tokens, mesh):
    raw = jnp.einsum("btd,vd->btv", h, emb)
    raw = lax.with_sharding_constraint(raw, NamedSharding(mesh, P("data", None, "vocab")))
    logits = soft_cap(raw)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
    p = jnp.exp(logits - lse[..., None])
    ent = lse - jnp.sum(p * logits, axis=-1)
    return picked - lse, lax.with_sharding_constraint(ent, NamedSharding(mesh, P("data", None)))


def logprobs_jit_entropy_uncapped(h, emb, tokens, mesh):
    raw = jnp.einsum("btd,vd->btv", h, emb)
    raw = lax.with_sharding_constraint(raw, NamedSharding(mesh, P("data", None, "vocab")))
    logits = soft_cap(raw)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
    p = jnp.exp(logits - lse[..., None])
    ent = lse - jnp.sum(p * raw, axis=-1)
    return picked - lse, lax.with_sharding_constraint(ent, NamedSharding(mesh, P("data", None)))
