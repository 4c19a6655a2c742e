"""FSDP for an equinox-style MLP: layers are frozen dataclasses registered as pytrees.

Weights use the torch/equinox `[out, in]` convention. The 1-D case keeps one flat parameter buffer
(all leaves concatenated and padded, like a flat-param wrapper) split across `data`; the 2-D case
shards each weight's non-TP dimension over `data` and its TP dimension over `model`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_IN, N_HIDDEN, N_TOKENS = 10, 20, 16


def _pytree(cls):
    cls = dataclasses.dataclass(frozen=True)(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    return jax.tree_util.register_dataclass(cls, data_fields=fields, meta_fields=[])


@_pytree
class Linear:
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return x @ self.weight.T + self.bias


@_pytree
class FeedForward:
    up: Linear
    down: Linear

    def __call__(self, x):
        return x + self.down(jax.nn.silu(self.up(x)))


def feed_forward(module: FeedForward, x):
    return module(x)


def feed_forward_inputs():
    def linear(n_out, n_in):
        return Linear(jax.ShapeDtypeStruct((n_out, n_in), jnp.float32),
                      jax.ShapeDtypeStruct((n_out,), jnp.float32))
    return (FeedForward(up=linear(N_HIDDEN, N_IN), down=linear(N_IN, N_HIDDEN)),
            jax.ShapeDtypeStruct((N_TOKENS, N_IN), jnp.float32))


def _flat_buffer(module, shards):
    leaves = jax.tree.leaves(module)
    flat = jnp.concatenate([leaf.reshape(-1) for leaf in leaves])
    pad = -flat.size % shards
    return jnp.pad(flat, (0, pad))


def _restore(flat, like):
    leaves, treedef = jax.tree.flatten(like)
    restored, start = [], 0
    for leaf in leaves:
        restored.append(lax.dynamic_slice_in_dim(flat, start, leaf.size).reshape(leaf.shape))
        start += leaf.size
    return jax.tree.unflatten(treedef, restored)


def feed_forward_flat_fsdp(module: FeedForward, x, mesh):
    shards = mesh.shape["data"]
    buffer = _flat_buffer(module, shards)

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("data"), P("data", None)),
                       out_specs=P("data", None))
    def run(buffer_shard, tokens):
        full = lax.all_gather(buffer_shard, "data", tiled=True)
        return _restore(full, module)(tokens)

    return run(buffer, x)


def _restore_rows(flat, like):
    leaves, treedef = jax.tree.flatten(like)
    restored, start = [], 0
    for leaf in leaves:
        restored.append(lax.dynamic_slice_in_dim(flat, start, leaf.size).reshape(leaf.shape))
        start += leaf.shape[0]
    return jax.tree.unflatten(treedef, restored)


def feed_forward_flat_fsdp_v2(module: FeedForward, x, mesh):
    buffer = _flat_buffer(module, mesh.shape["data"])

    def run(buffer_shard, tokens):
        full = lax.all_gather(buffer_shard, "data", tiled=True)
        return _restore_rows(full, module)(tokens)

    return jax.shard_map(run, mesh=mesh, in_specs=(P("data"), P("data", None)),
                         out_specs=P("data", None))(buffer, x)


_SPECS_2D = FeedForward(up=Linear(weight=P("model", "data"), bias=P("model")),
                        down=Linear(weight=P("data", "model"), bias=P()))


def _ffn_2d_body(module: FeedForward, tokens):
    w_up = lax.all_gather(module.up.weight, "data", axis=1, tiled=True)
    w_down = lax.all_gather(module.down.weight, "data", axis=0, tiled=True)
    hidden = jax.nn.silu(tokens @ w_up.T + module.up.bias)
    partial = hidden @ w_down.T
    return tokens + lax.psum(partial, "model") + module.down.bias


def feed_forward_fsdp_tp(module: FeedForward, x, mesh):
    run = jax.shard_map(_ffn_2d_body, mesh=mesh, in_specs=(_SPECS_2D, P("data", None)),
                        out_specs=P("data", None), check_vma=False)
    return run(module, x)


def feed_forward_fsdp_tp_v2(module: FeedForward, x, mesh):
    def body(m: FeedForward, tokens):
        w_up = lax.all_gather(m.up.weight, "data", axis=1, tiled=True)
        w_down = lax.all_gather(m.down.weight, "data", axis=0, tiled=True)
        hidden = jax.nn.silu(tokens @ w_up.T + m.up.bias)
        out = lax.psum(hidden @ w_down.T, "data")
        return tokens + out + m.down.bias

    run = jax.shard_map(body, mesh=mesh, in_specs=(_SPECS_2D, P("data", None)),
                        out_specs=P("data", None), check_vma=False)
    return run(module, x)
