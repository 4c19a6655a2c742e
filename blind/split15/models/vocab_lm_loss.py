"""Tiny LM loss: token embedding -> RMSNorm -> tanh MLP residual -> untied output head -> mean token
cross-entropy. Vocabulary-parallel (embedding rows and head columns) over `vocab` and batch over
`data` on {data: 2, vocab: 4}.

- `lm_loss_onehot`: embedding lookup and target logit as one-hot matmuls against the local vocab
  slice (`jax.nn.one_hot` of `ids - offset` is all-zero for ids owned elsewhere), softmax statistics
  with `pmax` / `psum`, batch mean by `pmean` over `data`;
- `lm_loss_take`: lookup by `jnp.take(mode="clip")` + ownership mask, target logit by
  `take_along_axis`, loss summed over the global batch with `psum` and divided by its token count.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, V = 4, 8, 16, 64
VP = 4
V_LOCAL = V // VP
DP = 2


def lm_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    params = {"embed": f(V, D), "norm": f(D), "w_mlp": f(D, D), "head": f(D, V)}
    return params, i(B, S), i(B, S)


def _trunk(params, h):
    h = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * params["norm"]
    return h + jnp.tanh(h @ params["w_mlp"])


def lm_loss(params, ids, labels):
    h = _trunk(params, params["embed"][ids])
    logits = h @ params["head"]
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - target)


SPECS = {"embed": P("vocab"), "norm": P(), "w_mlp": P(), "head": P(None, "vocab")}


def _run(local, params, ids, labels, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P("data"), P("data")),
                         out_specs=P(), check_vma=False)(params, ids, labels)


# ---- one-hot matmuls ----------------------------------------------------------------------------

def _onehot_local(params, ids, labels, sum_exp):
    offset = lax.axis_index("vocab") * V_LOCAL
    emb = lax.psum(jax.nn.one_hot(ids - offset, V_LOCAL) @ params["embed"], "vocab")
    logits = _trunk(params, emb) @ params["head"]
    gmax = lax.pmax(lax.stop_gradient(logits.max(axis=-1)), "vocab")
    lse = gmax + jnp.log(sum_exp(jnp.exp(logits - gmax[..., None])))
    target = lax.psum(jnp.sum(jax.nn.one_hot(labels - offset, V_LOCAL) * logits, axis=-1), "vocab")
    return lax.pmean(jnp.mean(lse - target), "data")


def _global_sum_exp(e):
    return lax.psum(jnp.sum(e, axis=-1), "vocab")


def _local_sum_exp(e):
    return jnp.sum(e, axis=-1)


def lm_loss_onehot(params, ids, labels, mesh):
    return _run(lambda p, i, l: _onehot_local(p, i, l, _global_sum_exp), params, ids, labels, mesh)


def lm_loss_onehot_local_sum(params, ids, labels, mesh):
    return _run(lambda p, i, l: _onehot_local(p, i, l, _local_sum_exp), params, ids, labels, mesh)


# ---- take + ownership masks ---------------------------------------------------------------------

def _owned(local_ids):
    return (local_ids >= 0) & (local_ids < V_LOCAL)


def _owned_inclusive(local_ids):
    return (local_ids >= 0) & (local_ids <= V_LOCAL)


def _take_local(params, ids, labels, owned):
    offset = lax.axis_index("vocab") * V_LOCAL
    local_ids = ids - offset
    rows = jnp.take(params["embed"], local_ids, axis=0, mode="clip")
    emb = lax.psum(jnp.where(owned(local_ids)[..., None], rows, 0.0), "vocab")
    logits = _trunk(params, emb) @ params["head"]
    gmax = lax.pmax(lax.stop_gradient(logits.max(axis=-1)), "vocab")
    lse = gmax + jnp.log(lax.psum(jnp.exp(logits - gmax[..., None]).sum(-1), "vocab"))
    local_labels = labels - offset
    picked = jnp.take_along_axis(logits, jnp.clip(local_labels, 0, V_LOCAL - 1)[..., None], axis=-1)
    target = lax.psum(jnp.where(_owned(local_labels), picked[..., 0], 0.0), "vocab")
    total = lax.psum(jnp.sum(lse - target), "data")
    return total / (B * S)


def lm_loss_take(params, ids, labels, mesh):
    return _run(lambda p, i, l: _take_local(p, i, l, _owned), params, ids, labels, mesh)


def lm_loss_take_inclusive_owner(params, ids, labels, mesh):
    return _run(lambda p, i, l: _take_local(p, i, l, _owned_inclusive), params, ids, labels, mesh)
