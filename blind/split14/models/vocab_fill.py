"""Token embedding -> one tanh mixing layer -> untied LM head -> mean next-token cross-entropy,
vocabulary sharded over {vocab: 4} (embedding rows and head columns).

- `ce_take_fill`: the shard-local lookup is `jnp.take(table, local, axis=0, mode="fill",
  fill_value=0)` (ids outside the shard read zeros; ids below the shard are first mapped past its
  end because negative indices wrap), psum-reduced; the loss uses a `pmax`-stabilised
  logsumexp with `psum` of the exponentials and the target logit read with
  `jnp.take_along_axis(..., mode="fill")` and psum-reduced;
- `ce_one_hot_gather`: lookup as `one_hot(ids - start, V_LOCAL) @ table` (out-of-range one-hots are
  all zeros), the local logits all-gathered along the vocabulary and the loss computed in full on
  every device.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

V, D, B, S = 64, 16, 4, 8
NV = 4
V_LOCAL = V // NV


def ce_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"embedding": f(V, D), "mix": f(D, D), "head": f(D, V)}
    ids = jax.ShapeDtypeStruct((B, S), jnp.int32)
    return params, ids, ids


def ce_loss(params, ids, targets):
    h = jnp.tanh(params["embedding"][ids] @ params["mix"])
    logp = jax.nn.log_softmax(h @ params["head"], axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return nll.mean()


SPECS = ({"embedding": P("vocab"), "mix": P(), "head": P(None, "vocab")}, P(), P())


def _shard_start():
    return lax.axis_index("vocab") * V_LOCAL


def _local_index(ids, start):
    # negative indices would wrap around in jnp.take: send them past the end, where mode="fill"
    # applies
    return jnp.where(ids < start, V_LOCAL, ids - start)


# ---- take(mode="fill") + pmax / psum logsumexp --------------------------------------------------

def _take_fill_local(lookup_mode):
    def local(p, ids, targets):
        start = _shard_start()
        e = jnp.take(p["embedding"], _local_index(ids, start), axis=0, mode=lookup_mode,
                     fill_value=0)
        h = jnp.tanh(lax.psum(e, "vocab") @ p["mix"])
        logits = h @ p["head"]
        m = lax.pmax(jax.lax.stop_gradient(logits.max(-1, keepdims=True)), "vocab")
        lse = jnp.log(lax.psum(jnp.exp(logits - m).sum(-1, keepdims=True), "vocab")) + m
        tgt = jnp.take_along_axis(logits, _local_index(targets, start)[..., None], axis=-1,
                                  mode="fill", fill_value=0)
        return jnp.mean(lse[..., 0] - lax.psum(tgt[..., 0], "vocab"))
    return local


def ce_take_fill(params, ids, targets, mesh):
    return jax.shard_map(_take_fill_local("fill"), mesh=mesh, in_specs=SPECS,
                         out_specs=P())(params, ids, targets)


def ce_take_clip(params, ids, targets, mesh):
    return jax.shard_map(_take_fill_local("clip"), mesh=mesh, in_specs=SPECS,
                         out_specs=P())(params, ids, targets)


# ---- one-hot lookup, gathered logits ------------------------------------------------------------

def _embed_one_hot(table, ids):
    return jax.nn.one_hot(ids - _shard_start(), V_LOCAL, dtype=table.dtype) @ table


def _embed_one_hot_unshifted(table, ids):
    return jax.nn.one_hot(ids, V_LOCAL, dtype=table.dtype) @ table


def _gathered_local(embed):
    def local(p, ids, targets):
        h = jnp.tanh(lax.psum(embed(p["embedding"], ids), "vocab") @ p["mix"])
        logits = lax.all_gather(h @ p["head"], "vocab", axis=2, tiled=True)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()
    return local


def ce_one_hot_gather(params, ids, targets, mesh):
    return jax.shard_map(_gathered_local(_embed_one_hot), mesh=mesh, in_specs=SPECS,
                         out_specs=P(), check_vma=False)(params, ids, targets)


def ce_one_hot_gather_unshifted(params, ids, targets, mesh):
    return jax.shard_map(_gathered_local(_embed_one_hot_unshifted), mesh=mesh, in_specs=SPECS,
                         out_specs=P(), check_vma=False)(params, ids, targets)
