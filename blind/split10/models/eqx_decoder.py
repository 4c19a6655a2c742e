"""Llama-style decoder layer written as Equinox-style modules (frozen dataclasses registered as pytrees).

The module tree itself is the parameter pytree. The sharded versions run the same modules inside
shard_map on a (data, model) mesh: batch over `data`, attention heads and the MLP hidden dim over
`model`, the row-parallel projections reduced with psum.
"""
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 4, 8, 32, 4, 8, 64


def _pytree(cls):
    cls = dataclass(frozen=True)(cls)
    names = [f for f in cls.__dataclass_fields__]
    return jax.tree_util.register_dataclass(cls, data_fields=names, meta_fields=[])


@_pytree
class RMSNorm:
    weight: jax.Array

    def __call__(self, x, eps=1e-6):
        ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * lax.rsqrt(ms + eps) * self.weight


@_pytree
class Attention:
    wq: jax.Array  # [D, heads, HD]
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array  # [heads, HD, D]

    def __call__(self, x):
        q = jnp.einsum("btd,dhk->bthk", x, self.wq)
        k = jnp.einsum("btd,dhk->bthk", x, self.wk)
        v = jnp.einsum("btd,dhk->bthk", x, self.wv)
        logits = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(jnp.float32(HD))
        causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), dtype=bool))
        logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
        probs = jax.nn.softmax(logits, axis=-1)
        ctx = jnp.einsum("bhqs,bshk->bqhk", probs, v)
        return jnp.einsum("bqhk,hkd->bqd", ctx, self.wo)


@_pytree
class SwiGLU:
    w_gate: jax.Array  # [D, F]
    w_up: jax.Array
    w_down: jax.Array  # [F, D]

    def __call__(self, x):
        return (jax.nn.silu(x @ self.w_gate) * (x @ self.w_up)) @ self.w_down


@_pytree
class DecoderLayer:
    attn_norm: RMSNorm
    attn: Attention
    mlp_norm: RMSNorm
    mlp: SwiGLU

    def __call__(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))


def layer_inputs():
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    layer = DecoderLayer(
        attn_norm=RMSNorm(s(D)),
        attn=Attention(s(D, H, HD), s(D, H, HD), s(D, H, HD), s(H, HD, D)),
        mlp_norm=RMSNorm(s(D)),
        mlp=SwiGLU(s(D, F), s(D, F), s(F, D)),
    )
    return layer, s(B, T, D)


def decoder_layer(layer, x):
    return layer(x)


# ---- tensor + data parallel -------------------------------------------------------------------

def _layer_specs(model_axis):
    return DecoderLayer(
        attn_norm=RMSNorm(P()),
        attn=Attention(P(None, model_axis), P(None, model_axis), P(None, model_axis),
                       P(model_axis)),
        mlp_norm=RMSNorm(P()),
        mlp=SwiGLU(P(None, model_axis), P(None, model_axis), P(model_axis)),
    )


def _tp_forward(layer, x, model_axis="model"):
    attn_out = lax.psum(layer.attn(layer.attn_norm(x)), model_axis)
    h = x + attn_out
    mlp_out = lax.psum(layer.mlp(layer.mlp_norm(h)), model_axis)
    return h + mlp_out


def _tp_forward_no_residual(layer, x, model_axis="model"):
    attn_out = lax.psum(layer.attn(layer.attn_norm(x)), model_axis)
    h = x + attn_out
    mlp_out = lax.psum(layer.mlp(layer.mlp_norm(h)), model_axis)
    return mlp_out


def decoder_layer_tp(layer, x, mesh):
    fn = jax.shard_map(_tp_forward, mesh=mesh, in_specs=(_layer_specs("model"), P("data")),
                       out_specs=P("data"))
    return fn(layer, x)


def decoder_layer_tp_no_residual(layer, x, mesh):
    fn = jax.shard_map(_tp_forward_no_residual, mesh=mesh,
                       in_specs=(_layer_specs("model"), P("data")), out_specs=P("data"))
    return fn(layer, x)


# ---- the same layer applied twice in a scan (weights tied), remat per step -----------------------

def decoder_twice(layer, x):
    for _ in range(2):
        x = layer(x)
    return x


def _scan_tied(layer, x, reduce_axis):
    @partial(jax.checkpoint, prevent_cse=False)
    def step(carry, _):
        with jax.named_scope("tied_layer"):
            a = lax.psum(layer.attn(layer.attn_norm(carry)), "model")
            carry = carry + a
            m = layer.mlp(layer.mlp_norm(carry))
            return carry + lax.psum(m, reduce_axis), None

    out, _ = lax.scan(step, x, None, length=2)
    return out


def decoder_twice_tp(layer, x, mesh):
    fn = jax.shard_map(partial(_scan_tied, reduce_axis="model"), mesh=mesh,
                       in_specs=(_layer_specs("model"), P("data")), out_specs=P("data"))
    return fn(layer, x)


def decoder_twice_tp_reduce_axis(layer, x, mesh):
    fn = jax.shard_map(partial(_scan_tied, reduce_axis="data"), mesh=mesh,
                       in_specs=(_layer_specs("model"), P("data")), out_specs=P("data"),
                       check_vma=False)
    return fn(layer, x)
