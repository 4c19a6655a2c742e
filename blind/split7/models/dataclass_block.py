"""Tiny transformer block written as pytree dataclass modules (equinox-like: parameters are the
fields, __call__ is the forward). The sharded entrypoint reuses the modules and only pins
shardings of parameters and activations (jit + NamedSharding, no shard_map)."""
import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, H, F = 2, 4, 16, 4, 32


def _pytree(cls):
    cls = dataclasses.dataclass(frozen=True)(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    return jax.tree_util.register_dataclass(cls, data_fields=fields, meta_fields=[])


@_pytree
class LayerNorm:
    gamma: jax.Array
    beta: jax.Array

    def __call__(self, x):
        mean = x.mean(-1, keepdims=True)
        var = jnp.var(x, axis=-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * self.gamma + self.beta


@_pytree
class SelfAttention:
    qkv: jax.Array   # [D, 3D]
    out: jax.Array   # [D, D]

    def __call__(self, x, pin: Callable = lambda t, *s: t):
        qkv = pin(x @ self.qkv, "data", None, "model")
        q, k, v = (t.reshape(*x.shape[:2], H, D // H) for t in jnp.split(qkv, 3, axis=-1))
        w = jax.nn.softmax(jnp.einsum("...qhd,...khd->...hqk", q, k) / jnp.sqrt(D // H), axis=-1)
        o = jnp.einsum("...hqk,...khd->...qhd", w, v).reshape(x.shape)
        return pin(o @ self.out, "data", None, None)


@_pytree
class FeedForward:
    up: jax.Array
    down: jax.Array

    def __call__(self, x, pin: Callable = lambda t, *s: t):
        return pin(pin(jax.nn.gelu(x @ self.up), "data", None, "model") @ self.down, "data", None, None)


@_pytree
class Block:
    ln1: LayerNorm
    attn: SelfAttention
    ln2: LayerNorm
    ffn: FeedForward

    def __call__(self, x, pin: Callable = lambda t, *s: t):
        x = x + self.attn(self.ln1(x), pin)
        return x + self.ffn(self.ln2(x), pin)


def inputs():
    f = jnp.float32
    s = lambda *shape: jax.ShapeDtypeStruct(shape, f)  # noqa: E731
    block = Block(LayerNorm(s(D), s(D)), SelfAttention(s(D, 3 * D), s(D, D)),
                  LayerNorm(s(D), s(D)), FeedForward(s(D, F), s(F, D)))
    return block, s(B, S, D)


def forward(block: Block, x):
    return block(x)


def _pinner(mesh):
    def pin(t, *spec):
        return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P(*spec)))
    return pin


def _shard_params(block: Block, pin) -> Block:
    attn = SelfAttention(pin(block.attn.qkv, None, "model"), pin(block.attn.out, "model", None))
    ffn = FeedForward(pin(block.ffn.up, None, "model"), pin(block.ffn.down, "model", None))
    return dataclasses.replace(block, attn=attn, ffn=ffn)


def forward_sharded(block: Block, x, mesh):
    pin = _pinner(mesh)
    block = _shard_params(block, pin)
    return block(pin(x, "data", None, None), pin)


def forward_sharded_unrolled(block: Block, x, mesh):
    pin = _pinner(mesh)
    blk = _shard_params(block, pin)
    x = pin(x, "data", None, None)
    x = x + blk.attn(blk.ln1(x), pin)
    h = blk.ln2(x)
    return h + blk.ffn(h, pin)
