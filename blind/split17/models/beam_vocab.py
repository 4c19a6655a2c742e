"""Tied-embedding LM step for beam search: embedding lookup, a tanh mixing layer, tied logits,
the mean next-token cross-entropy and the top-4 candidates (log-probs and token ids) of the last
position, as a beam-search expansion step would request them.

- `beam_step_vocab_sharded`: the tied table is split by rows over {vocab: 4}: masked lookup + psum,
  a pmax/psum log-partition, masked label pick + psum, and a two-stage top-k (local `lax.top_k`,
  ids shifted to global, `all_gather`, top-k of the candidates);
- `beam_step_hidden_sharded`: the table is split by columns (the hidden dim) over `hid` with the
  batch over `dp`: local lookups, a row-parallel mixing layer, logits as a psum of partial dot
  products over the hidden dim, then an ordinary log-softmax and top-k.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, V, D, K = 4, 8, 64, 16, 4


def beam_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    return {"embedding": f(V, D), "mix": f(D, D)}, i(B, S), i(B, S)


def beam_step(params, tokens, labels):
    table = params["embedding"]
    h = jnp.tanh(table[tokens] @ params["mix"])
    logp = jax.nn.log_softmax(h @ table.T, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    top_lp, top_id = lax.top_k(logp[:, -1], K)
    return jnp.mean(nll), top_lp, top_id


# ---- rows of the table over vocab -------------------------------------------------------------------

def _owned(ids, offset, rows):
    local = ids - offset
    return (local >= 0) & (local < rows), jnp.clip(local, 0, rows - 1)


def _vocab_local(params, tokens, labels, shard_offset):
    table = params["embedding"]
    rows = table.shape[0]
    offset = lax.axis_index("vocab") * rows
    mine, local = _owned(tokens, offset, rows)
    emb = lax.psum(jnp.where(mine[..., None], table[local], 0.0), "vocab")
    logits = jnp.tanh(emb @ params["mix"]) @ table.T
    m = lax.pmax(jnp.max(logits, axis=-1, keepdims=True), "vocab")
    lse = m + jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1, keepdims=True), "vocab"))
    logp = logits - lse
    mine, local = _owned(labels, offset, rows)
    picked = jnp.take_along_axis(logp, local[..., None], axis=-1)[..., 0]
    nll = -lax.psum(jnp.where(mine, picked, 0.0), "vocab")
    cand_lp, cand_id = lax.top_k(logp[:, -1], K)
    cand_id = cand_id + shard_offset(rows)
    all_lp = lax.all_gather(cand_lp, "vocab", axis=1, tiled=True)
    all_id = lax.all_gather(cand_id, "vocab", axis=1, tiled=True)
    top_lp, pos = lax.top_k(all_lp, K)
    return jnp.mean(nll), top_lp, jnp.take_along_axis(all_id, pos, axis=1)


def _vocab_sharded(params, tokens, labels, mesh, shard_offset):
    local = lambda p, t, l: _vocab_local(p, t, l, shard_offset)
    specs = {"embedding": P("vocab", None), "mix": P()}
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, P(), P()), out_specs=(P(), P(), P()),
                         check_vma=False)(params, tokens, labels)


def beam_step_vocab_sharded(params, tokens, labels, mesh):
    return _vocab_sharded(params, tokens, labels, mesh,
                          shard_offset=lambda rows: lax.axis_index("vocab") * rows)


def beam_step_vocab_sharded_k_offset(params, tokens, labels, mesh):
    return _vocab_sharded(params, tokens, labels, mesh,
                          shard_offset=lambda rows: lax.axis_index("vocab") * K)


# ---- columns of the table over hid -----------------------------------------------------------------

def _hidden_local(params, tokens, labels):
    table = params["embedding"]  # [V, D / hid]
    cols = table.shape[1]
    h = jnp.tanh(lax.psum(table[tokens] @ params["mix"], "hid"))
    h_cols = lax.dynamic_slice_in_dim(h, lax.axis_index("hid") * cols, cols, axis=-1)
    logits = lax.psum(h_cols @ table.T, "hid")
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    top_lp, top_id = lax.top_k(logp[:, -1], K)
    return lax.pmean(jnp.mean(nll), "dp"), top_lp, top_id


def _hidden_local_unreduced_logits(params, tokens, labels):
    table = params["embedding"]  # [V, D / hid]
    cols = table.shape[1]
    h = jnp.tanh(lax.psum(table[tokens] @ params["mix"], "hid"))
    h_cols = lax.dynamic_slice_in_dim(h, lax.axis_index("hid") * cols, cols, axis=-1)
    logits = h_cols @ table.T
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    top_lp, top_id = lax.top_k(logp[:, -1], K)
    return lax.pmean(jnp.mean(nll), "dp"), top_lp, top_id


def _hidden_sharded(local, params, tokens, labels, mesh):
    specs = {"embedding": P(None, "hid"), "mix": P("hid", None)}
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, P("dp"), P("dp")),
                         out_specs=(P(), P("dp"), P("dp")), check_vma=False)(params, tokens, labels)


def beam_step_hidden_sharded(params, tokens, labels, mesh):
    return _hidden_sharded(_hidden_local, params, tokens, labels, mesh)


def beam_step_hidden_sharded_unreduced_logits(params, tokens, labels, mesh):
    return _hidden_sharded(_hidden_local_unreduced_logits, params, tokens, labels, mesh)
