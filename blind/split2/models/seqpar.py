"""Haiku-style pure functions over a nested parameter dict: a pre-LN transformer block.

Sequence parallelism (Megatron-SP): the residual stream is sharded over the sequence on the `sp`
axis, which is also the tensor-parallel axis for heads and the MLP hidden dimension.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, WIDTH, HEADS, HEAD_DIM, MLP = 2, 8, 16, 4, 4, 32


def layer_norm(p, x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * p["scale"] + p["offset"]


def self_attention(p, x):
    q = jnp.einsum("bsd,dhe->bshe", x, p["query"])
    k = jnp.einsum("bsd,dhe->bshe", x, p["key"])
    v = jnp.einsum("bsd,dhe->bshe", x, p["value"])
    att = jax.nn.softmax(jnp.einsum("bshe,bthe->bhst", q, k) * HEAD_DIM ** -0.5, axis=-1)
    return jnp.einsum("bshe,hed->bsd", jnp.einsum("bhst,bthe->bshe", att, v), p["out"])


def mlp(p, x):
    return jnp.einsum("bsf,fd->bsd", jax.nn.gelu(jnp.einsum("bsd,df->bsf", x, p["w1"])), p["w2"])


def block(params, x):
    x = x + self_attention(params["attn"], layer_norm(params["ln1"], x))
    return x + mlp(params["mlp"], layer_norm(params["ln2"], x))


def block_inputs():
    def s(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)
    params = {
        "ln1": {"scale": s(WIDTH), "offset": s(WIDTH)},
        "attn": {"query": s(WIDTH, HEADS, HEAD_DIM), "key": s(WIDTH, HEADS, HEAD_DIM),
                 "value": s(WIDTH, HEADS, HEAD_DIM), "out": s(HEADS, HEAD_DIM, WIDTH)},
        "ln2": {"scale": s(WIDTH), "offset": s(WIDTH)},
        "mlp": {"w1": s(WIDTH, MLP), "w2": s(MLP, WIDTH)},
    }
    return params, s(BATCH, SEQ, WIDTH)


PARAM_SPECS = {
    "ln1": {"scale": P(), "offset": P()},
    "attn": {"query": P(None, "sp", None), "key": P(None, "sp", None),
             "value": P(None, "sp", None), "out": P("sp", None, None)},
    "ln2": {"scale": P(), "offset": P()},
    "mlp": {"w1": P(None, "sp"), "w2": P("sp", None)},
}


def _gather_seq(x):
    return lax.all_gather(x, "sp", axis=1, tiled=True)


def _scatter_seq(x):
    return lax.psum_scatter(x, "sp", scatter_dimension=1, tiled=True)


def block_sp(params, x, mesh):
    def local(params, x_shard):
        normed = layer_norm(params["ln1"], x_shard)
        x_shard = x_shard + _scatter_seq(self_attention(params["attn"], _gather_seq(normed)))
        normed = layer_norm(params["ln2"], x_shard)
        return x_shard + _scatter_seq(mlp(params["mlp"], _gather_seq(normed)))

    return jax.shard_map(local, mesh=mesh, in_specs=(PARAM_SPECS, P(None, "sp", None)),
                         out_specs=P(None, "sp", None))(params, x)


def _reduce_then_slice(x):
    """All-reduce, then keep this rank's sequence chunk (same result as a reduce-scatter)."""
    chunk = x.shape[1] // lax.axis_size("sp")
    full = lax.psum(x, "sp")
    return lax.dynamic_slice_in_dim(full, lax.axis_index("sp") * chunk, chunk, axis=1)


def block_sp_allreduce(params, x, mesh):
    def local(params, x_shard):
        h = _gather_seq(layer_norm(params["ln1"], x_shard))
        x_shard = x_shard + _reduce_then_slice(self_attention(params["attn"], h))
        h = _gather_seq(layer_norm(params["ln2"], x_shard))
        return x_shard + _reduce_then_slice(mlp(params["mlp"], h))

    return jax.shard_map(local, mesh=mesh, in_specs=(PARAM_SPECS, P(None, "sp", None)),
                         out_specs=P(None, "sp", None))(params, x)


def block_sp_v2(params, x, mesh):
    def local(params, x_shard):
        normed = layer_norm(params["ln1"], x_shard)
        x_shard = x_shard + _scatter_seq(self_attention(params["attn"], _gather_seq(normed)))
        normed = layer_norm(params["ln2"], x_shard)
        return x_shard + _scatter_seq(mlp(params["mlp"], _gather_seq(x_shard)))

    return jax.shard_map(local, mesh=mesh, in_specs=(PARAM_SPECS, P(None, "sp", None)),
                         out_specs=P(None, "sp", None))(params, x)
