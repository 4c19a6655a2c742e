"""Tiny tied-embedding language model with a vocabulary-parallel embedding and cross-entropy.

Parameters use GPT-2-flax-style nested scopes: params["transformer"]["wte"]["embedding"] etc.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, V = 4, 8, 16, 64


def lm_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    params = {"transformer": {"wte": {"embedding": f(V, D)},
                              "h_0": {"mlp": {"kernel": f(D, D), "bias": f(D)}},
                              "ln_f": {"scale": f(D)}}}
    return params, i(B, T), i(B, T)


def _body(tp, h):
    mlp = tp["h_0"]["mlp"]
    h = h + jnp.tanh(h @ mlp["kernel"] + mlp["bias"])
    return h * lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6) * tp["ln_f"]["scale"]


def _hidden(params, ids):
    tp = params["transformer"]
    return _body(tp, tp["wte"]["embedding"][ids])


def token_losses(params, ids, labels):
    logits = _hidden(params, ids) @ params["transformer"]["wte"]["embedding"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]


def lm_loss(params, ids, labels):
    return jnp.mean(token_losses(params, ids, labels))


# ---- vocab-parallel with an explicit ownership mask (vocab=4) ------------------------------------

class VocabShard:
    def __init__(self, table, axis):
        self.table, self.axis = table, axis
        self.rows = table.shape[0]
        self.start = lax.axis_index(axis) * self.rows

    def owned(self, ids):
        return (ids >= self.start) & (ids < self.start + self.rows)

    def embed(self, ids):
        mine = self.owned(ids)
        local = jnp.where(mine, ids - self.start, 0)
        rows = jnp.take(self.table, local, axis=0, mode="clip")
        return lax.psum(jnp.where(mine[..., None], rows, 0.0), self.axis)

    def cross_entropy(self, h, labels):
        logits = h @ self.table.T
        m = lax.pmax(lax.stop_gradient(jnp.max(logits, axis=-1)), self.axis)
        sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1), self.axis)
        mine = self.owned(labels)
        local = jnp.where(mine, labels - self.start, 0)
        picked = jnp.take_along_axis(logits, local[..., None], axis=-1, mode="clip")[..., 0]
        target = lax.psum(jnp.where(mine, picked, 0.0), self.axis)
        return jnp.log(sum_exp) + m - target


class VocabShardUpperInclusive(VocabShard):
    def owned(self, ids):
        return (ids >= self.start) & (ids <= self.start + self.rows)


def _vp_loss(shard_cls):
    def local(params, ids, labels):
        tp = params["transformer"]
        shard = shard_cls(tp["wte"]["embedding"], "vocab")
        h = _body(tp, shard.embed(ids))
        return jnp.mean(shard.cross_entropy(h, labels))
    return local


def _param_specs(vocab_axis):
    return {"transformer": {"wte": {"embedding": P(vocab_axis, None)},
                            "h_0": {"mlp": {"kernel": P(), "bias": P()}},
                            "ln_f": {"scale": P()}}}


def lm_loss_vp(params, ids, labels, mesh):
    return jax.shard_map(_vp_loss(VocabShard), mesh=mesh,
                         in_specs=(_param_specs("vocab"), P(), P()), out_specs=P())(params, ids, labels)


def lm_loss_vp_inclusive(params, ids, labels, mesh):
    return jax.shard_map(_vp_loss(VocabShardUpperInclusive), mesh=mesh,
                         in_specs=(_param_specs("vocab"), P(), P()), out_specs=P())(params, ids, labels)


# ---- one-hot embedding, batch x vocab 2-D mesh, per-token losses --------------------------------

def _onehot_losses(params, ids, labels, global_max):
    tp = params["transformer"]
    table = tp["wte"]["embedding"]
    n = table.shape[0]
    lo = lax.axis_index("vocab") * n
    h = lax.psum(jax.nn.one_hot(ids - lo, n, dtype=table.dtype) @ table, "vocab")
    logits = _body(tp, h) @ table.T
    m = global_max(lax.stop_gradient(logits.max(-1, keepdims=True)))
    lse = jnp.log(lax.psum(jnp.exp(logits - m).sum(-1, keepdims=True), "vocab")) + m
    target = lax.psum(jnp.sum(jax.nn.one_hot(labels - lo, n) * logits, -1), "vocab")
    return lse[..., 0] - target


def token_losses_2d(params, ids, labels, mesh):
    def local(params, ids, labels):
        return _onehot_losses(params, ids, labels, lambda m: lax.pmax(m, "vocab"))
    return jax.shard_map(local, mesh=mesh, in_specs=(_param_specs("vocab"), P("batch"), P("batch")),
                         out_specs=P("batch"))(params, ids, labels)


def token_losses_2d_local_max(params, ids, labels, mesh):
    def local(params, ids, labels):
        return _onehot_losses(params, ids, labels, lambda m: m)
    return jax.shard_map(local, mesh=mesh, in_specs=(_param_specs("vocab"), P("batch"), P("batch")),
                         out_specs=P("batch"), check_vma=False)(params, ids, labels)
