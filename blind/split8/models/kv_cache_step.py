"""Single-token decode: write the new K/V into the cache at `pos`, attend to positions <= pos."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BSZ, MAX_LEN, D_MODEL, N_HEADS, D_HEAD = 2, 8, 16, 4, 4


class AttnWeights(NamedTuple):
    wq: jax.Array  # [D_MODEL, N_HEADS, D_HEAD]
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array  # [N_HEADS, D_HEAD, D_MODEL]


class Cache(NamedTuple):
    k: jax.Array  # [BSZ, MAX_LEN, N_HEADS, D_HEAD]
    v: jax.Array


def _step(w, cache, x, pos, visible):
    q = jnp.einsum("bd,dhk->bhk", x, w.wq)
    k_new = jnp.einsum("bd,dhk->bhk", x, w.wk)
    v_new = jnp.einsum("bd,dhk->bhk", x, w.wv)
    k = lax.dynamic_update_slice(cache.k, k_new[:, None], (0, pos, 0, 0))
    v = lax.dynamic_update_slice(cache.v, v_new[:, None], (0, pos, 0, 0))
    s = jnp.einsum("bhk,bthk->bht", q, k) * D_HEAD ** -0.5
    s = jnp.where(visible(jnp.arange(MAX_LEN), pos)[None, None], s, -1e30)
    o = jnp.einsum("bht,bthk->bhk", jax.nn.softmax(s, axis=-1), v)
    return jnp.einsum("bhk,hkd->bd", o, w.wo), Cache(k, v)


def decode_step(w, cache, x, pos):
    return _step(w, cache, x, pos, lambda t, p: t <= p)


def decode_inputs():
    f = jnp.float32
    proj = jax.ShapeDtypeStruct((D_MODEL, N_HEADS, D_HEAD), f)
    kv = jax.ShapeDtypeStruct((BSZ, MAX_LEN, N_HEADS, D_HEAD), f)
    return (AttnWeights(proj, proj, proj, jax.ShapeDtypeStruct((N_HEADS, D_HEAD, D_MODEL), f)),
            Cache(kv, kv), jax.ShapeDtypeStruct((BSZ, D_MODEL), f),
            jax.ShapeDtypeStruct((), jnp.int32))


_W_SPEC = AttnWeights(P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp"))
_C_SPEC = Cache(P(None, None, "tp"), P(None, None, "tp"))


def decode_step_tp(w, cache, x, pos):
    def local(w, cache, x, pos):
        y, cache = _step(w, cache, x, pos, lambda t, p: t <= p)
        return lax.psum(y, "tp"), cache

    fn = jax.shard_map(local, in_specs=(_W_SPEC, _C_SPEC, P(), P()), out_specs=(P(), _C_SPEC))
    return fn(w, cache, x, pos)


def decode_step_tp_v2(w, cache, x, pos):
    def local(w, cache, x, pos):
        y, cache = _step(w, cache, x, pos, lambda t, p: t < p)
        return lax.psum(y, "tp"), cache

    fn = jax.shard_map(local, in_specs=(_W_SPEC, _C_SPEC, P(), P()), out_specs=(P(), _C_SPEC))
    return fn(w, cache, x, pos)
