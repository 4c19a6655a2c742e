"""ViT front end: 4x4 patches of an NHWC image embedded by a strided convolution (HWIO kernel), a
learned [CLS] token prepended, learned absolute position embeddings added, then LayerNorm. The
reference uses `lax.conv_general_dilated`; the distributed versions are jit programs that only
place shardings and let the partitioner insert collectives.

- `embed_patches_jit`: on {data: 2, model: 4}, patches cut "einops style" (reshape + transpose)
  and multiplied by the flattened kernel, hidden dim constrained over model, batch over data;
- `embed_conv_jit`: on {data: 2, model: 2}, the convolution kept, with `jax.jit(in_shardings=...,
  out_shardings=...)` placing the kernel's output channels over model.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, IMG, C, PATCH, D = 2, 16, 3, 4, 32
GRID = IMG // PATCH
N = GRID * GRID


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(B, IMG, IMG, C), f(PATCH, PATCH, C, D), f(D), f(N + 1, D), f(D), f(D)


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = jnp.square(x - mu).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-6) * g + b


def _conv(img, kernel):
    y = lax.conv_general_dilated(img, kernel, (PATCH, PATCH), "VALID",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y.reshape(img.shape[0], N, D)


def _finish(tokens, cls, pos, g, b):
    cls = jnp.broadcast_to(cls, (tokens.shape[0], 1, D))
    return layer_norm(jnp.concatenate([cls, tokens], axis=1) + pos, g, b)


def embed(img, kernel, cls, pos, g, b):
    return _finish(_conv(img, kernel), cls, pos, g, b)


# ---- patches by reshape/transpose ---------------------------------------------------------------

def _patches(img):
    x = img.reshape(img.shape[0], GRID, PATCH, GRID, PATCH, C)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(img.shape[0], N, PATCH * PATCH * C)


def _patches_grid_transposed(img):
    x = img.reshape(img.shape[0], GRID, PATCH, GRID, PATCH, C)
    return x.transpose(0, 3, 1, 2, 4, 5).reshape(img.shape[0], N, PATCH * PATCH * C)


def _embed_patches(img, kernel, cls, pos, g, b, mesh, patches):
    hidden = NamedSharding(mesh, P("data", None, "model"))
    w = lax.with_sharding_constraint(kernel.reshape(PATCH * PATCH * C, D),
                                     NamedSharding(mesh, P(None, "model")))
    tokens = lax.with_sharding_constraint(patches(img) @ w, hidden)
    return lax.with_sharding_constraint(_finish(tokens, cls, pos, g, b), hidden)


def embed_patches_jit(img, kernel, cls, pos, g, b, mesh):
    return _embed_patches(img, kernel, cls, pos, g, b, mesh, _patches)


def embed_patches_jit_grid_transposed(img, kernel, cls, pos, g, b, mesh):
    return _embed_patches(img, kernel, cls, pos, g, b, mesh, _patches_grid_transposed)


# ---- convolution kept, shardings given to jax.jit -----------------------------------------------

def _with_cls_last(tokens, cls, pos, g, b):
    cls = jnp.broadcast_to(cls, (tokens.shape[0], 1, D))
    return layer_norm(jnp.concatenate([tokens, cls], axis=1) + pos, g, b)


def _embed_conv(args, mesh, finish):
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    run = jax.jit(lambda img, k, cls, pos, g, b: finish(_conv(img, k), cls, pos, g, b),
                  in_shardings=(s("data"), s(None, None, None, "model"), s(), s(), s(), s()),
                  out_shardings=s("data", None, "model"))
    return run(*args)


def embed_conv_jit(img, kernel, cls, pos, g, b, mesh):
    return _embed_conv((img, kernel, cls, pos, g, b), mesh, _finish)


def embed_conv_jit_cls_last(img, kernel, cls, pos, g, b, mesh):
    return _embed_conv((img, kernel, cls, pos, g, b), mesh, _with_cls_last)
