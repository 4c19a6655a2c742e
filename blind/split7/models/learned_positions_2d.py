# Learned absolute position embeddings + LayerNorm + projection, on a 2-D (data x sequence) mesh.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, MAX_POS, DIM, OUT = 4, 8, 16, 8, 8


def inputs():
    f = jnp.float32
    return dict(x=jax.ShapeDtypeStruct((BATCH, SEQ, DIM), f),
                pos_table=jax.ShapeDtypeStruct((MAX_POS, DIM), f),
                ln_gamma=jax.ShapeDtypeStruct((DIM,), f),
                ln_beta=jax.ShapeDtypeStruct((DIM,), f),
                proj=jax.ShapeDtypeStruct((DIM, OUT), f)),


def layer_norm(h, gamma, beta, eps=1e-5):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / jnp.sqrt(var + eps) * gamma + beta


def embed_positions(batch):
    h = batch["x"] + batch["pos_table"][:SEQ][None]
    return layer_norm(h, batch["ln_gamma"], batch["ln_beta"]) @ batch["proj"]


def _sharded(batch, mesh, seq_axis_for_offset):
    specs = dict(x=P("dp", "sp"), pos_table=P(), ln_gamma=P(), ln_beta=P(), proj=P())

    def local(b):
        s_loc = b["x"].shape[1]
        start = lax.axis_index(seq_axis_for_offset) * s_loc
        pos = lax.dynamic_slice_in_dim(b["pos_table"], start, s_loc, axis=0)
        h = b["x"] + pos[None]
        return layer_norm(h, b["ln_gamma"], b["ln_beta"]) @ b["proj"]

    return jax.shard_map(local, mesh=mesh, in_specs=(specs,), out_specs=P("dp", "sp"))(batch)


def embed_positions_2d(batch, mesh):
    return _sharded(batch, mesh, "sp")


def embed_positions_2d_axis(batch, mesh):
    return _sharded(batch, mesh, "dp")
