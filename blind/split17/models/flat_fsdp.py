"""A 2-layer pre-norm GeGLU (tanh-approximate GELU) residual MLP stack whose checkpoint stores
every tensor as a padded 1-D flat buffer (PyTorch FSDP-style flat parameters, padded to a
multiple of 8 elements); use sites slice off the padding and reshape to the logical shape, and a
`tree_map` over the parameter tree and a shape tree drives the unflattening.

- `mlp_fsdp`: on {fsdp: 4}: flat buffers and the batch over fsdp, each buffer all-gathered (tiled)
  inside a `named_scope` before it is unpadded and reshaped;
- `mlp_fsdp_2d`: on {a: 2, b: 2}: flat buffers and the batch split over both axes at once
  (`P(("a", "b"))`), buffers gathered with one `all_gather` over ("a", "b").
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, F, LAYERS, ALIGN = 4, 8, 18, 30, 2, 8
SHAPES = [{"norm": (D,), "gate": (D, F), "up": (D, F), "down": (F, D)} for _ in range(LAYERS)]


def _padded(shape):
    n = math.prod(shape)
    return -(-n // ALIGN) * ALIGN


def flat_inputs():
    flat = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct((_padded(s),), jnp.float32), SHAPES,
                                  is_leaf=lambda s: isinstance(s, tuple))
    return flat, jax.ShapeDtypeStruct((B, S, D), jnp.float32)


def unflatten(flat, shape):
    return flat[: math.prod(shape)].reshape(shape)


def _unflatten_all(flat_params):
    return jax.tree_util.tree_map(lambda f, s: unflatten(f, s), flat_params, SHAPES,
                                  is_leaf=lambda s: isinstance(s, tuple))


def _layer(w, x):
    h = x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w["norm"]
    gate = jax.nn.gelu(h @ w["gate"], approximate=True)
    return x + (gate * (h @ w["up"])) @ w["down"]


def mlp_stack(flat_params, x):
    for w in _unflatten_all(flat_params):
        x = _layer(w, x)
    return x


# ---- fsdp over one axis ------------------------------------------------------------------------------

def _unflatten_out_in(flat, shape):
    return flat[: math.prod(shape)].reshape(shape[::-1]).T


def _fsdp_local(flat_shards, x, axes, unflatten_fn):
    for shards, shapes in zip(flat_shards, SHAPES):
        with jax.named_scope("fsdp_gather"):
            full = {k: lax.all_gather(v, axes, tiled=True) for k, v in shards.items()}
        x = _layer({k: unflatten_fn(full[k], shape) for k, shape in shapes.items()}, x)
    return x


def _fsdp(flat_params, x, mesh, axes, unflatten_fn):
    specs = jax.tree_util.tree_map(lambda _: P(axes), flat_params)
    return jax.shard_map(lambda f_, x_: _fsdp_local(f_, x_, axes, unflatten_fn), mesh=mesh,
                         in_specs=(specs, P(axes)), out_specs=P(axes), check_vma=False)(flat_params, x)


def mlp_fsdp(flat_params, x, mesh):
    return _fsdp(flat_params, x, mesh, "fsdp", unflatten)


def mlp_fsdp_out_in_layout(flat_params, x, mesh):
    return _fsdp(flat_params, x, mesh, "fsdp", _unflatten_out_in)


# ---- fsdp over two axes at once -------------------------------------------------------------------------

def mlp_fsdp_2d(flat_params, x, mesh):
    return _fsdp(flat_params, x, mesh, ("a", "b"), unflatten)


def mlp_fsdp_2d_gather_order_swapped(flat_params, x, mesh):
    specs = jax.tree_util.tree_map(lambda _: P(("a", "b")), flat_params)
    return jax.shard_map(lambda f_, x_: _fsdp_local(f_, x_, ("b", "a"), unflatten), mesh=mesh,
                         in_specs=(specs, P(("a", "b"))), out_specs=P(("a", "b")),
                         check_vma=False)(flat_params, x)
