"""DPO loss on a tiny tied-embedding LM: hidden states are projected on the embedding matrix
(vocab 64), next-token log-probs of the chosen and the rejected continuation are summed over the
response mask, and loss = -log sigmoid(beta * ((pc - rc) - (pr - rr))) with the frozen reference
policy's sums given as inputs. Returns (loss, per-pair chosen reward).

- `dpo_vocab_shards`: shard_map on {tp: 4}, embedding rows split over vocab; max, sum-exp and the
  label logit are combined with pmax / psum (label in this rank's [lo, lo + V/tp));
- `dpo_jit`: jit-partitioned on {dp: 2, tp: 2}, pairs over dp, the embedding over tp, sharding
  constraints on the logits.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

N, T, D, V = 4, 8, 16, 64
BETA = 0.5


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    return (f(V, D), f(2, N, T, D), i(2, N, T), jax.ShapeDtypeStruct((N, T), jnp.bool_), f(2, N))


def _token_logprobs(emb, h, tokens):
    logits = jnp.einsum("...td,vd->...tv", h[..., :-1, :], emb)
    logp = jax.nn.log_softmax(logits, -1)
    return jnp.take_along_axis(logp, tokens[..., 1:, None], -1)[..., 0]


def _loss(lp, mask, ref_sums):
    sums = jnp.sum(lp * mask[:, 1:], axis=-1)  # [2, N]: chosen, rejected
    margin = (sums[0] - ref_sums[0]) - (sums[1] - ref_sums[1])
    loss = -jnp.mean(jax.nn.log_sigmoid(BETA * margin))
    return loss, BETA * (sums[0] - ref_sums[0])


def dpo(emb, hidden, tokens, mask, ref_sums):
    return _loss(_token_logprobs(emb, hidden, tokens), mask, ref_sums)


# ---- vocab-parallel shard_map --------------------------------------------------------------------

def _sharded_logprobs(emb, h, tokens, global_index):
    vl = emb.shape[0]
    lo = lax.axis_index("tp") * vl
    logits = jnp.einsum("...td,vd->...tv", h[..., :-1, :], emb)
    m = lax.pmax(jnp.max(logits, -1), "tp")
    lse = m + jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), -1), "tp"))
    labels = tokens[..., 1:]
    mine = (labels >= lo) & (labels < lo + vl)
    idx = global_index(labels, lo, vl)
    picked = jnp.take_along_axis(logits, idx[..., None], -1)[..., 0]
    return lax.psum(jnp.where(mine, picked, 0.0), "tp") - lse


def _local_index(labels, lo, vl):
    return jnp.clip(labels - lo, 0, vl - 1)


def _global_index_clipped(labels, lo, vl):
    return jnp.clip(labels, 0, vl - 1)


def _run_shards(emb, hidden, tokens, mask, ref_sums, mesh, index):
    def local(emb, hidden, tokens, mask, ref_sums):
        return _loss(_sharded_logprobs(emb, hidden, tokens, index), mask, ref_sums)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("tp"), P(), P(), P(), P()),
                         out_specs=(P(), P()), check_vma=False)(emb, hidden, tokens, mask, ref_sums)


def dpo_vocab_shards(emb, hidden, tokens, mask, ref_sums, mesh):
    return _run_shards(emb, hidden, tokens, mask, ref_sums, mesh, _local_index)


def dpo_vocab_shards_global_label(emb, hidden, tokens, mask, ref_sums, mesh):
    return _run_shards(emb, hidden, tokens, mask, ref_sums, mesh, _global_index_clipped)


# ---- jit with sharding constraints ---------------------------------------------------------------

def _jit_dpo(emb, hidden, tokens, mask, ref_sums, mesh, shift):
    emb = lax.with_sharding_constraint(emb, NamedSharding(mesh, P("tp")))
    hidden = lax.with_sharding_constraint(hidden, NamedSharding(mesh, P(None, "dp")))
    logits = jnp.einsum("cntd,vd->cntv", hidden[:, :, :-1], emb)
    logits = lax.with_sharding_constraint(logits, NamedSharding(mesh, P(None, "dp", None, "tp")))
    logp = logits - jax.nn.logsumexp(logits, -1, keepdims=True)
    labels = tokens[:, :, shift:T - 1 + shift]
    lp = jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]
    return _loss(lp, mask, ref_sums)


def dpo_jit(emb, hidden, tokens, mask, ref_sums, mesh):
    return _jit_dpo(emb, hidden, tokens, mask, ref_sums, mesh, shift=1)


def dpo_jit_labels_unshifted(emb, hidden, tokens, mask, ref_sums, mesh):
    return _jit_dpo(emb, hidden, tokens, mask, ref_sums, mesh, shift=0)
