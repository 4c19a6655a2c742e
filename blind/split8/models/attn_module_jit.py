"""Causal multi-head attention written as a small module object that closes over the mesh."""
import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

BATCH, SEQ, D_MODEL, N_HEADS = 4, 8, 16, 4
HEAD_DIM = D_MODEL // N_HEADS


def causal_attention(x, wq, wk, wv, wo):
    b, s, _ = x.shape
    q = (x @ wq).reshape(b, s, N_HEADS, HEAD_DIM)
    k = (x @ wk).reshape(b, s, N_HEADS, HEAD_DIM)
    v = (x @ wv).reshape(b, s, N_HEADS, HEAD_DIM)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM)
    causal = jnp.arange(s)[:, None] >= jnp.arange(s)[None, :]
    logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v)
    return o.reshape(b, s, D_MODEL) @ wo


def attention_inputs():
    f = jnp.float32
    w = jax.ShapeDtypeStruct((D_MODEL, D_MODEL), f)
    return jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), f), w, w, w, w


@dataclasses.dataclass(frozen=True)
class ShardedAttention:
    mesh: jax.sharding.Mesh
    scale: float

    def put(self, x, *spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, P(*spec)))

    def heads(self, x, w):
        b, s, _ = x.shape
        y = self.put(x @ self.put(w, None, "model"), "data", None, "model")
        return self.put(y.reshape(b, s, N_HEADS, HEAD_DIM), "data", None, "model", None)

    def __call__(self, x, wq, wk, wv, wo):
        x = self.put(x, "data", None, None)
        q, k, v = self.heads(x, wq), self.heads(x, wk), self.heads(x, wv)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        s = x.shape[1]
        causal = jnp.arange(s)[:, None] >= jnp.arange(s)[None, :]
        logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v)
        o = self.put(o, "data", None, "model", None).reshape(x.shape)
        return self.put(o @ self.put(wo, "model", None), "data", None, None)


def causal_attention_jit(x, wq, wk, wv, wo, mesh):
    return ShardedAttention(mesh, scale=HEAD_DIM ** -0.5)(x, wq, wk, wv, wo)


def causal_attention_jit_v2(x, wq, wk, wv, wo, mesh):
    return ShardedAttention(mesh, scale=D_MODEL ** -0.5)(x, wq, wk, wv, wo)
