"""Token embedding + one tanh projection + untied LM head + mean token cross-entropy, vocab sharded.

Mesh {batch: 2, vocab: 4}: tokens over `batch`, the embedding table's rows and the head's columns
over `vocab` (16 of the 64 ids per device).

- `loss_onehot`: T5X-style one-hot embedding (`jax.nn.one_hot(ids - start, VL) @ table_shard`,
  ids outside the shard give a zero row), psum over vocab; cross-entropy from a pmax-stabilised
  psum of exponentials and a one-hot target logit, psum'd;
- `loss_masked_lookup`: the embedding is a masked local lookup with clipped indices; the logits are
  all-gathered over vocab and the loss computed with `log_softmax` + `take_along_axis`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, V = 8, 16, 16, 64
NV = 4
VL = V // NV


def loss_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    return {"embed": f(V, D), "proj": f(D, D), "head": f(D, V)}, i(B, S), i(B, S)


def lm_loss(params, ids, labels):
    h = jnp.tanh(params["embed"][ids] @ params["proj"])
    logp = jax.nn.log_softmax(h @ params["head"], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


SPECS = {"embed": P("vocab", None), "proj": P(), "head": P(None, "vocab")}


def _shard_start():
    return lax.axis_index("vocab") * VL


# ---- one-hot -----------------------------------------------------------------------------------------

def _onehot_local(params, ids, labels, reduce_target):
    start = _shard_start()
    emb = lax.psum(jax.nn.one_hot(ids - start, VL, dtype=jnp.float32) @ params["embed"], "vocab")
    h = jnp.tanh(emb @ params["proj"])
    logits = h @ params["head"]
    m = lax.pmax(lax.stop_gradient(logits.max(-1, keepdims=True)), "vocab")
    lse = jnp.log(lax.psum(jnp.exp(logits - m).sum(-1, keepdims=True), "vocab")) + m
    target = reduce_target((jax.nn.one_hot(labels - start, VL) * logits).sum(-1, keepdims=True))
    return lax.pmean(jnp.mean(lse - target), "batch")


def _onehot(reduce_target, params, ids, labels, mesh):
    return jax.shard_map(lambda p, i, y: _onehot_local(p, i, y, reduce_target), mesh=mesh,
                         in_specs=(SPECS, P("batch"), P("batch")), out_specs=P(),
                         check_vma=False)(params, ids, labels)


def loss_onehot(params, ids, labels, mesh):
    return _onehot(lambda t: lax.psum(t, "vocab"), params, ids, labels, mesh)


def loss_onehot_target_unreduced(params, ids, labels, mesh):
    return _onehot(lambda t: t, params, ids, labels, mesh)


# ---- masked lookup + gathered logits -----------------------------------------------------------------

def _lookup(table, ids):
    local = ids - _shard_start()
    owned = (local >= 0) & (local < VL)
    rows = table[jnp.clip(local, 0, VL - 1)]
    return lax.psum(jnp.where(owned[..., None], rows, 0.0), "vocab")


def _lookup_inclusive(table, ids):
    local = ids - _shard_start()
    owned = (local >= 0) & (local <= VL)
    rows = table[jnp.clip(local, 0, VL - 1)]
    return lax.psum(jnp.where(owned[..., None], rows, 0.0), "vocab")


def _gathered_local(params, ids, labels, lookup):
    h = jnp.tanh(lookup(params["embed"], ids) @ params["proj"])
    logits = lax.all_gather(h @ params["head"], "vocab", axis=-1, tiled=True)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)
    return lax.pmean(nll.mean(), "batch")


def _gathered(lookup, params, ids, labels, mesh):
    return jax.shard_map(lambda p, i, y: _gathered_local(p, i, y, lookup), mesh=mesh,
                         in_specs=(SPECS, P("batch"), P("batch")), out_specs=P(),
                         check_vma=False)(params, ids, labels)


def loss_masked_lookup(params, ids, labels, mesh):
    return _gathered(_lookup, params, ids, labels, mesh)


def loss_masked_lookup_inclusive(params, ids, labels, mesh):
    return _gathered(_lookup_inclusive, params, ids, labels, mesh)
