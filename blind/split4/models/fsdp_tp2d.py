"""2-D mesh: FSDP over 'data' (gather the weight's other dim) plus Megatron TP over 'model'."""

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, H = 8, 16, 32


def specs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((D, H), f),
            jax.ShapeDtypeStruct((H, D), f))


def block(x, w1, w2):
    return jnp.einsum("bh,hd->bd", jax.nn.relu(jnp.einsum("bd,dh->bh", x, w1)), w2)


def block_2d(x, w1, w2, mesh):
    @partial(jax.shard_map, mesh=mesh,
             in_specs=(P("data", None), P("data", "model"), P("model", "data")),
             out_specs=P("data", None))
    def inner(xb, w1s, w2s):
        w1g = lax.all_gather(w1s, "data", axis=0, tiled=True)
        w2g = lax.all_gather(w2s, "data", axis=1, tiled=True)
        h = jax.nn.relu(jnp.einsum("bd,dh->bh", xb, w1g))
        return lax.psum(jnp.einsum("bh,hd->bd", h, w2g), "model")

    return inner(x, w1, w2)


def block_2d_wrong_axis(x, w1, w2, mesh):
    @partial(jax.shard_map, mesh=mesh,
             in_specs=(P("data", None), P("data", "model"), P("model", "data")),
             out_specs=P("data", None), check_vma=False)
    def inner(xb, w1s, w2s):
        w1g = lax.all_gather(w1s, "data", axis=0, tiled=True)
        w2g = lax.all_gather(w2s, "data", axis=1, tiled=True)
        h = jax.nn.relu(jnp.einsum("bd,dh->bh", xb, w1g))
        return lax.psum(jnp.einsum("bh,hd->bd", h, w2g), "data")

    return inner(x, w1, w2)
