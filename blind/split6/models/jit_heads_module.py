"""Bidirectional multi-head attention as a small dataclass module; the distributed version is the
same math under jit, with the head axis pinned to 'model' by sharding constraints (no shard_map)."""
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class MHA:
    heads: int = 4
    head_dim: int = 4
    batch: int = 2
    seq: int = 6

    @property
    def width(self):
        return self.heads * self.head_dim

    def __call__(self, params, x):
        q = jnp.einsum("bsd,dhk->bhsk", x, params["wq"])
        k = jnp.einsum("bsd,dhk->bhsk", x, params["wk"])
        v = jnp.einsum("bsd,dhk->bhsk", x, params["wv"])
        a = jax.nn.softmax(jnp.einsum("bhqk,bhsk->bhqs", q, k) / self.head_dim**0.5, axis=-1)
        o = jnp.einsum("bhqs,bhsk->bqhk", a, v)
        return jnp.einsum("bqhk,hkd->bqd", o, params["wo"])


MODULE = MHA()


def mha(params, x):
    return MODULE(params, x)


def _pin(t, mesh, spec):
    return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, spec))


def _mha_jit(params, x, mesh, merge_heads):
    m = MODULE
    heads = P(None, None, "model", None)
    w = {name: _pin(params[name], mesh, P(None, "model", None)) for name in ("wq", "wk", "wv")}
    q = _pin((x @ w["wq"].reshape(m.width, -1)).reshape(m.batch, m.seq, m.heads, m.head_dim), mesh, heads)
    k = _pin((x @ w["wk"].reshape(m.width, -1)).reshape(m.batch, m.seq, m.heads, m.head_dim), mesh, heads)
    v = _pin((x @ w["wv"].reshape(m.width, -1)).reshape(m.batch, m.seq, m.heads, m.head_dim), mesh, heads)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))                 # [B, H, S, hd]
    scores = q @ k.transpose(0, 1, 3, 2) / m.head_dim**0.5
    o = jax.nn.softmax(scores, axis=-1) @ v                                 # [B, H, S, hd]
    o = _pin(merge_heads(o), mesh, P(None, None, "model"))
    out = o @ params["wo"].reshape(m.width, m.width)
    return _pin(out, mesh, P())


def mha_jit(params, x, mesh):
    m = MODULE
    return _mha_jit(params, x, mesh, lambda o: o.transpose(0, 2, 1, 3).reshape(m.batch, m.seq, m.width))


def mha_jit_merge_order(params, x, mesh):
    m = MODULE
    return _mha_jit(params, x, mesh, lambda o: o.reshape(m.batch, m.seq, m.width))


def example_inputs():
    m, f = MODULE, jnp.float32
    w = jax.ShapeDtypeStruct((m.width, m.heads, m.head_dim), f)
    params = {"wq": w, "wk": w, "wv": w, "wo": jax.ShapeDtypeStruct((m.heads, m.head_dim, m.width), f)}
    return params, jax.ShapeDtypeStruct((m.batch, m.seq, m.width), f)
