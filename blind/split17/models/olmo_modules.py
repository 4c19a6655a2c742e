"""OLMo-style 2-layer decoder written as Equinox-like pytree modules (dataclasses registered with
`jax.tree_util.register_dataclass`, hand-written `__call__`), non-parametric LayerNorm (no scale, no
bias), causal attention with per-head [D, H, HD] kernels, SwiGLU, einsums at `precision=HIGHEST`.

- `decoder_tp`: on {data: 2, tensor: 4}, batch over `data`, heads and FFN columns over `tensor`, one
  psum per sub-layer inside a sharded layer function;
- `decoder_tp_2d`: on {x: 2, y: 2}, heads and FFN columns split over both axes at once
  (`P(None, ("x", "y"))`) and the row-parallel partial sums reduced with one `psum(("x", "y"))`.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, F, L = 4, 8, 32, 8, 64, 2
HD = D // H
EPS = 1e-5
HIGH = lax.Precision.HIGHEST


def _module(cls):
    cls = dataclasses.dataclass(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    return jax.tree_util.register_dataclass(cls, data_fields=names, meta_fields=[])


def _identity(t):
    return t


@_module
class Attention:
    wq: jax.Array  # [D, H, HD]
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array  # [H, HD, D]

    def __call__(self, x, reduce=_identity):
        q = jnp.einsum("bsd,dhk->bhsk", x, self.wq, precision=HIGH)
        k = jnp.einsum("bsd,dhk->bhsk", x, self.wk, precision=HIGH)
        v = jnp.einsum("bsd,dhk->bhsk", x, self.wv, precision=HIGH)
        scores = jnp.einsum("bhqk,bhsk->bhqs", q, k, precision=HIGH) * HD ** -0.5
        seq = x.shape[1]
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        ctx = jnp.einsum("bhqs,bhsk->bqhk", probs, v, precision=HIGH)
        return reduce(jnp.einsum("bqhk,hkd->bqd", ctx, self.wo, precision=HIGH))


@_module
class SwiGLU:
    w_gate: jax.Array  # [D, F]
    w_up: jax.Array  # [D, F]
    w_down: jax.Array  # [F, D]

    def __call__(self, x, reduce=_identity):
        gate = jnp.einsum("bsd,df->bsf", x, self.w_gate, precision=HIGH)
        up = jnp.einsum("bsd,df->bsf", x, self.w_up, precision=HIGH)
        return reduce(jnp.einsum("bsf,fd->bsd", jax.nn.silu(gate) * up, self.w_down, precision=HIGH))


@_module
class Block:
    attn: Attention
    mlp: SwiGLU


@_module
class Decoder:
    blocks: list


def layer_norm(x):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + EPS)


def decoder_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    blocks = [Block(Attention(f(D, H, HD), f(D, H, HD), f(D, H, HD), f(H, HD, D)),
                    SwiGLU(f(D, F), f(D, F), f(F, D))) for _ in range(L)]
    return Decoder(blocks), f(B, S, D)


def decoder(model, x):
    for blk in model.blocks:
        x = x + blk.attn(layer_norm(x))
        x = x + blk.mlp(layer_norm(x))
    return x


# ---- tensor parallel -------------------------------------------------------------------------------

def _specs(model, axes):
    def block_spec(_):
        return Block(Attention(P(None, axes, None), P(None, axes, None), P(None, axes, None),
                               P(axes, None, None)),
                     SwiGLU(P(None, axes), P(None, axes), P(axes, None)))
    return Decoder([block_spec(b) for b in model.blocks])


def _sharded_layers(model, x, axes):
    reduce = functools.partial(lax.psum, axis_name=axes)
    for blk in model.blocks:
        x = x + blk.attn(layer_norm(x), reduce=reduce)
        x = x + blk.mlp(layer_norm(x), reduce=reduce)
    return x


def _sharded_layers_ffn_replaces_residual(model, x, axes):
    reduce = functools.partial(lax.psum, axis_name=axes)
    for blk in model.blocks:
        x = x + blk.attn(layer_norm(x), reduce=reduce)
        x = blk.mlp(layer_norm(x), reduce=reduce)
    return x


def decoder_tp(model, x, mesh):
    local = functools.partial(_sharded_layers, axes="tensor")
    return jax.shard_map(local, mesh=mesh, in_specs=(_specs(model, "tensor"), P("data")),
                         out_specs=P("data"), check_vma=False)(model, x)


def decoder_tp_no_ffn_residual(model, x, mesh):
    local = functools.partial(_sharded_layers_ffn_replaces_residual, axes="tensor")
    return jax.shard_map(local, mesh=mesh, in_specs=(_specs(model, "tensor"), P("data")),
                         out_specs=P("data"), check_vma=False)(model, x)


def decoder_tp_2d(model, x, mesh):
    local = functools.partial(_sharded_layers, axes=("x", "y"))
    return jax.shard_map(local, mesh=mesh, in_specs=(_specs(model, ("x", "y")), P()),
                         out_specs=P(), check_vma=False)(model, x)


def decoder_tp_2d_reduce_x_only(model, x, mesh):
    def local(m, h):
        reduce = functools.partial(lax.psum, axis_name="x")
        for blk in m.blocks:
            h = h + blk.attn(layer_norm(h), reduce=reduce)
            h = h + blk.mlp(layer_norm(h), reduce=reduce)
        return h
    return jax.shard_map(local, mesh=mesh, in_specs=(_specs(model, ("x", "y")), P()),
                         out_specs=P(), check_vma=False)(model, x)
