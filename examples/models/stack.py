"""A stack of identical MLP blocks with a residual stream (squashed by tanh
so that float rounding stays small for the numeric oracle), and its tensor-/sequence-parallel versions.

Every block runs under `jax.named_scope(f"layers_{i}")` and the head under `lm_head`, which is how
equivci splits a model into layers: identical blocks are proved once. The sizes are tiny on
purpose (the numeric oracle runs them on random inputs); `STACK_LAYERS` sets the depth.
"""

import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TP = "tp"
SEQ, D_MODEL, D_FF, VOCAB = 8, 16, 32, 24
LAYERS = int(os.environ.get("STACK_LAYERS", "4"))
F32 = jnp.float32


def inputs():
    def s(*shape):
        return jax.ShapeDtypeStruct(shape, F32)

    layers = [{"w_in": s(D_MODEL, D_FF), "w_out": s(D_FF, D_MODEL)} for _ in range(LAYERS)]
    return s(SEQ, D_MODEL), {"layers": layers, "head": s(D_MODEL, VOCAB)}


def _head(h, w_head):
    with jax.named_scope("lm_head"):
        return jnp.tanh(h) @ w_head


def reference(x, params):
    h = x
    for i, layer in enumerate(params["layers"]):
        with jax.named_scope(f"layers_{i}"):
            h = jnp.tanh(h + jnp.tanh(h @ layer["w_in"]) @ layer["w_out"])
    return _head(h, params["head"])


def _specs(params, w_in, w_out, head):
    return {"layers": [{"w_in": w_in, "w_out": w_out} for _ in params["layers"]], "head": head}


def tensor_parallel(x, params, *, mesh):
    """Megatron: w_in column-parallel, w_out row-parallel + psum; vocab-parallel head."""
    def body(x, params):
        h = x
        for i, layer in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                h = jnp.tanh(h + lax.psum(jnp.tanh(h @ layer["w_in"]) @ layer["w_out"], TP))
        return _head(h, params["head"])

    specs = _specs(params, P(None, TP), P(TP, None), P(None, TP))
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), specs), out_specs=P(None, TP))(x, params)


def sequence_parallel(x, params, *, mesh):
    """The residual stream stays sharded along the sequence between blocks: all-gather before the
    column-parallel matmul, reduce-scatter after the row-parallel one."""
    def body(x, params):
        h = x  # (SEQ / tp, D_MODEL)
        for i, layer in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                full = lax.all_gather(h, TP, axis=0, tiled=True)
                h = jnp.tanh(h + lax.psum_scatter(jnp.tanh(full @ layer["w_in"]) @ layer["w_out"], TP,
                                                  scatter_dimension=0, tiled=True))
        return _head(lax.all_gather(h, TP, axis=0, tiled=True), params["head"])

    specs = _specs(params, P(None, TP), P(TP, None), P(None, TP))
    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), specs), out_specs=P(None, TP))(x, params)


def sequence_parallel_late_residual(x, params, *, mesh):
    """Buggy: the residual is added to the gathered stream, so every shard's block output carries
    the whole sequence's residual summed over the shards."""
    def body(x, params):
        h = x
        for i, layer in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                full = lax.all_gather(h, TP, axis=0, tiled=True)
                h = jnp.tanh(lax.psum_scatter(full + jnp.tanh(full @ layer["w_in"]) @ layer["w_out"], TP,  # BUG: residual summed tp times
                                              scatter_dimension=0, tiled=True))
        return _head(lax.all_gather(h, TP, axis=0, tiled=True), params["head"])

    specs = _specs(params, P(None, TP), P(TP, None), P(None, TP))
    return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), specs), out_specs=P(None, TP))(x, params)
