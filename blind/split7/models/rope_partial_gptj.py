"""GPT-J / NeoX-20B style partial rotary embedding: only the first ROT_DIMS of each head are
rotated, as interleaved (even, odd) pairs; the rest pass through. Sequence split over 'seq'."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

B, L, NH, HD = 2, 8, 2, 8
ROT_DIMS = 4
THETA = 10000.0


def inputs():
    return (jax.ShapeDtypeStruct((B, L, NH * HD), jnp.float32),
            jax.ShapeDtypeStruct((NH * HD, NH * HD), jnp.float32),
            jax.ShapeDtypeStruct((NH * HD, NH * HD), jnp.float32))


def rotate_every_two(x, positions):
    inv = 1.0 / THETA ** (jnp.arange(0, ROT_DIMS, 2, dtype=jnp.float32) / ROT_DIMS)
    ang = positions[:, None].astype(jnp.float32) * inv[None, :]          # [L, ROT/2]
    sin, cos = jnp.sin(ang)[None, :, None, :], jnp.cos(ang)[None, :, None, :]
    rot, keep = x[..., :ROT_DIMS], x[..., ROT_DIMS:]
    even, odd = rot[..., 0::2], rot[..., 1::2]
    r_even = even * cos - odd * sin
    r_odd = odd * cos + even * sin
    rot = jnp.stack([r_even, r_odd], axis=-1).reshape(rot.shape)
    return jnp.concatenate([rot, keep], axis=-1)


def qk_rotary(x, wq, wk):
    q = (x @ wq).reshape(B, L, NH, HD)
    k = (x @ wk).reshape(B, L, NH, HD)
    pos = jnp.arange(L)
    return rotate_every_two(q, pos), rotate_every_two(k, pos)


def qk_rotary_sp(x, wq, wk, mesh):
    def chunk(xc, wq, wk):
        n = xc.shape[1]
        q = (xc @ wq).reshape(B, n, NH, HD)
        k = (xc @ wk).reshape(B, n, NH, HD)
        pos = jax.lax.axis_index("seq") * n + jnp.arange(n)
        return rotate_every_two(q, pos), rotate_every_two(k, pos)

    spec = P(None, "seq")
    return jax.shard_map(chunk, mesh=mesh, in_specs=(spec, P(), P()),
                         out_specs=(spec, spec))(x, wq, wk)


def qk_rotary_sp_local_pos(x, wq, wk, mesh):
    def chunk(xc, wq, wk):
        n = xc.shape[1]
        q = (xc @ wq).reshape(B, n, NH, HD)
        k = (xc @ wk).reshape(B, n, NH, HD)
        pos = jnp.arange(n)
        return rotate_every_two(q, pos), rotate_every_two(k, pos)

    spec = P(None, "seq")
    return jax.shard_map(chunk, mesh=mesh, in_specs=(spec, P(), P()),
                         out_specs=(spec, spec))(x, wq, wk)
