"""Input stage of a GPT-2 style decoder: token vectors plus learned absolute position vectors,
then an output projection. The context-parallel version splits the sequence over 'cp'."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


class InputStage:
    batch, seq, width, max_len = 2, 16, 8, 32

    def __call__(self, tok, pos_table, w_out):
        positions = jnp.arange(self.seq)
        h = tok + pos_table[positions][None]
        return jnp.tanh(h) @ w_out

    def shapes(self):
        f32 = jnp.float32
        return (
            jax.ShapeDtypeStruct((self.batch, self.seq, self.width), f32),
            jax.ShapeDtypeStruct((self.max_len, self.width), f32),
            jax.ShapeDtypeStruct((self.width, self.width), f32),
        )


STAGE = InputStage()


def forward(tok, pos_table, w_out):
    return STAGE(tok, pos_table, w_out)


def forward_inputs():
    return STAGE.shapes()


def forward_cp(tok, pos_table, w_out, mesh):
    local = STAGE.seq // mesh.shape["cp"]

    def shard(tok_c, table, w):
        start = jax.lax.axis_index("cp") * local
        positions = start + jnp.arange(local)
        h = tok_c + jnp.take(table, positions, axis=0)[None]
        return jnp.tanh(h) @ w

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(None, "cp"), P(), P()), out_specs=P(None, "cp"))(
        tok, pos_table, w_out
    )


def forward_cp_local_positions(tok, pos_table, w_out, mesh):
    local = STAGE.seq // mesh.shape["cp"]

    def shard(tok_c, table, w):
        positions = jnp.arange(local)
        h = tok_c + jnp.take(table, positions, axis=0)[None]
        return jnp.tanh(h) @ w

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(None, "cp"), P(), P()), out_specs=P(None, "cp"))(
        tok, pos_table, w_out
    )
