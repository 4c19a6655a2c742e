"""NeoX-style (half rotation) RoPE of q and k from precomputed tables, at positions offset+i."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BS, SEQ, NH, HD, TABLE_LEN = 2, 16, 2, 8, 32


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x, cos, sin):
    cos = jnp.concatenate([cos, cos], -1)[None, :, None, :]
    sin = jnp.concatenate([sin, sin], -1)[None, :, None, :]
    return x * cos + rotate_half(x) * sin


def rope_qk(q, k, cos_table, sin_table, offset):
    cos = lax.dynamic_slice_in_dim(cos_table, offset, SEQ)
    sin = lax.dynamic_slice_in_dim(sin_table, offset, SEQ)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def rope_inputs():
    f = jnp.float32
    x = jax.ShapeDtypeStruct((BS, SEQ, NH, HD), f)
    tab = jax.ShapeDtypeStruct((TABLE_LEN, HD // 2), f)
    return x, x, tab, tab, jax.ShapeDtypeStruct((), jnp.int32)


def rope_qk_sp(q, k, cos_table, sin_table, offset):
    def local(q, k, cos_table, sin_table, offset):
        n = q.shape[1]
        start = offset + lax.axis_index("seq") * n
        cos = lax.dynamic_slice_in_dim(cos_table, start, n)
        sin = lax.dynamic_slice_in_dim(sin_table, start, n)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    seq = P(None, "seq")
    return jax.shard_map(local, in_specs=(seq, seq, P(), P(), P()), out_specs=(seq, seq))(
        q, k, cos_table, sin_table, offset)


def rope_qk_sp_v2(q, k, cos_table, sin_table, offset):
    def local(q, k, cos_table, sin_table, offset):
        n = q.shape[1]
        start = lax.axis_index("seq") * n
        cos = lax.dynamic_slice_in_dim(cos_table, start, n)
        sin = lax.dynamic_slice_in_dim(sin_table, start, n)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    seq = P(None, "seq")
    return jax.shard_map(local, in_specs=(seq, seq, P(), P(), P()), out_specs=(seq, seq))(
        q, k, cos_table, sin_table, offset)
