"""Bidirectional multi-head attention written for explicit-sharding mode: the entrypoint switches
the mesh to Explicit axes, reshards weights per head, uses einsum out_sharding, and leaves the
softmax to the partitioner through auto_axes."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jax.sharding import auto_axes, explicit_axes, reshard

B, S, H, HD = 2, 4, 4, 4
D = H * HD


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((D, D), f),
            jax.ShapeDtypeStruct((D, D), f), jax.ShapeDtypeStruct((D, D), f),
            jax.ShapeDtypeStruct((D, D), f))


def mha(x, wq, wk, wv, wo):
    def split(t):
        return t.reshape(B, S, H, HD)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
    p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / HD ** 0.5, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, S, D) @ wo


def _mha_explicit(x, wq, wk, wv, wo, split):
    wq, wk, wv = (reshard(w, P(None, "tp")) for w in (wq, wk, wv))
    wo = reshard(wo, P("tp", None))
    q, k, v = (split(jnp.einsum("bsd,de->bse", x, w, out_sharding=P("dp", None, "tp")))
               for w in (wq, wk, wv))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, out_sharding=P("dp", "tp")) / HD ** 0.5
    p = auto_axes(lambda s: jax.nn.softmax(s, axis=-1), out_sharding=P("dp", "tp"))(s)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, v, out_sharding=P("dp", None, "tp"))
    o = reshard(o.reshape(B, S, D), P("dp", None, None))
    return jnp.einsum("bsd,de->bse", o, wo, out_sharding=P("dp", None, None))


def mha_explicit(x, wq, wk, wv, wo):
    def split(t):
        return t.reshape(B, S, H, HD)

    fn = explicit_axes(lambda *a: _mha_explicit(*a, split), axes=("dp", "tp"),
                       in_sharding=(P("dp"), P(), P(), P(), P()))
    return fn(x, wq, wk, wv, wo)


def mha_explicit_heads(x, wq, wk, wv, wo):
    def split(t):
        return t.reshape(B, S, HD, H).swapaxes(-1, -2)

    fn = explicit_axes(lambda *a: _mha_explicit(*a, split), axes=("dp", "tp"),
                       in_sharding=(P("dp"), P(), P(), P(), P()))
    return fn(x, wq, wk, wv, wo)
