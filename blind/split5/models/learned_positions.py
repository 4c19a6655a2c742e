# Learned absolute position embeddings on a {dp, sp} mesh: batch over 'dp', sequence over 'sp'.
# Each device slices its rows of the position table at its sequence offset.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, WIDTH, MAX_POS = 4, 8, 8, 16


def positional_inputs():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, WIDTH), jnp.float32),
            jax.ShapeDtypeStruct((MAX_POS, WIDTH), jnp.float32),
            jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32))


def add_positions(tok, pos_table, proj):
    h = tok + pos_table[:SEQ][None]
    return jnp.tanh(h @ proj)


def add_positions_2d(tok, pos_table, proj, mesh):
    def local(tok, pos_table, proj):
        chunk = tok.shape[1]
        start = lax.axis_index("sp") * chunk
        pos = lax.dynamic_slice_in_dim(pos_table, start, chunk, axis=0)
        return jnp.tanh((tok + pos[None]) @ proj)

    return jax.shard_map(local, mesh=mesh, in_specs=(P("dp", "sp"), P(), P()),
                         out_specs=P("dp", "sp"))(tok, pos_table, proj)


def add_positions_2d_wrong_axis(tok, pos_table, proj, mesh):
    def local(tok, pos_table, proj):
        chunk = tok.shape[1]
        start = lax.axis_index("dp") * chunk
        pos = lax.dynamic_slice_in_dim(pos_table, start, chunk, axis=0)
        return jnp.tanh((tok + pos[None]) @ proj)

    return jax.shard_map(local, mesh=mesh, in_specs=(P("dp", "sp"), P(), P()),
                         out_specs=P("dp", "sp"))(tok, pos_table, proj)
