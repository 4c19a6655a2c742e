"""Grouped-query attention written with ellipsis einsums; KV heads sharded with their query groups."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

B, S, D = 2, 5, 16
HQ, HKV, HD = 8, 4, 4
GROUP = HQ // HKV


def gqa(x, wq, wk, wv, wo):
    """x [B,S,D]; wq [D,HQ,HD]; wk, wv [D,HKV,HD]; wo [HQ,HD,D]. Query head h reads KV head h // GROUP."""
    q = jnp.einsum("...d,dhk->...hk", x, wq)
    k = jnp.repeat(jnp.einsum("...d,dhk->...hk", x, wk), GROUP, axis=-2)
    v = jnp.repeat(jnp.einsum("...d,dhk->...hk", x, wv), GROUP, axis=-2)
    logits = jnp.einsum("...qhk,...shk->...hqs", q, k) * HD**-0.5
    probs = jax.nn.softmax(logits, axis=-1)
    ctx = jnp.einsum("...hqs,...shk->...qhk", probs, v)
    return jnp.einsum("...hk,hkd->...d", ctx, wo)


def _expand_repeat(t):
    return jnp.repeat(t, GROUP, axis=2)


def _expand_tile(t):
    return jnp.tile(t, (1, 1, GROUP, 1))


def _gqa_sharded(expand):
    def local(x, wq, wk, wv, wo):
        q = jnp.einsum("bsd,dhk->bshk", x, wq)
        k = expand(jnp.einsum("bsd,dhk->bshk", x, wk))
        v = expand(jnp.einsum("bsd,dhk->bshk", x, wv))
        logits = jnp.einsum("bqhk,bshk->bhqs", q, k) * HD**-0.5
        ctx = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(logits, axis=-1), v)
        return jax.lax.psum(jnp.einsum("bqhk,hkd->bqd", ctx, wo), "heads")

    heads = P(None, "heads", None)
    return jax.shard_map(local, in_specs=(P(), heads, heads, heads, P("heads", None, None)),
                         out_specs=P())


def gqa_tp(x, wq, wk, wv, wo):
    return _gqa_sharded(_expand_repeat)(x, wq, wk, wv, wo)


def gqa_tp_tiled_kv(x, wq, wk, wv, wo):
    return _gqa_sharded(_expand_tile)(x, wq, wk, wv, wo)


def inputs():
    s, f = jax.ShapeDtypeStruct, jnp.float32
    return (s((B, S, D), f), s((D, HQ, HD), f), s((D, HKV, HD), f), s((D, HKV, HD), f),
            s((HQ, HD, D), f))
