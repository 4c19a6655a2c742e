"""One pre-norm decoder block (RMSNorm with 1+w scale, causal MHA, GELU MLP, two residuals),
tensor parallel over heads/hidden and sequence parallel between the sublayers (Megatron-SP)."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, F = 2, 8, 16, 4, 32
HD = D // H


def inputs():
    f = jnp.float32
    p = dict(ln1=(D,), wqkv=(D, 3, H, HD), wo=(H, HD, D), ln2=(D,), w1=(D, F), w2=(F, D))
    return jax.ShapeDtypeStruct((B, S, D), f), {k: jax.ShapeDtypeStruct(v, f) for k, v in p.items()}


def norm(x, w):
    return x * lax.rsqrt(jnp.mean(x ** 2, -1, keepdims=True) + 1e-6) * (1 + w)


def attn(h, wqkv, wo):
    q, k, v = jnp.einsum("bsd,dthe->tbshe", h, wqkv)
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(HD)
    n = h.shape[1]
    s = jnp.where(jnp.arange(n)[:, None] >= jnp.arange(n)[None, :], s, -1e9)
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, -1), v)
    return jnp.einsum("bqhe,hed->bqd", o, wo)


def block(x, p):
    x = x + attn(norm(x, p["ln1"]), p["wqkv"], p["wo"])
    return x + jax.nn.gelu(norm(x, p["ln2"]) @ p["w1"]) @ p["w2"]


PSPEC = dict(ln1=P(), wqkv=P(None, None, "tp"), wo=P("tp"), ln2=P(), w1=P(None, "tp"), w2=P("tp"))
SEQ = P(None, "tp")


def block_sp(x, p, mesh):
    def local(x, p):
        h = lax.all_gather(norm(x, p["ln1"]), "tp", axis=1, tiled=True)
        x = x + lax.psum_scatter(attn(h, p["wqkv"], p["wo"]), "tp", scatter_dimension=1, tiled=True)
        h = lax.all_gather(norm(x, p["ln2"]), "tp", axis=1, tiled=True)
        y = jax.nn.gelu(h @ p["w1"]) @ p["w2"]
        return x + lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True)

    return jax.shard_map(local, mesh=mesh, in_specs=(SEQ, PSPEC), out_specs=SEQ)(x, p)


def block_sp_2(x, p, mesh):
    def local(x, p):
        h = lax.all_gather(norm(x, p["ln1"]), "tp", axis=1, tiled=True)
        a = lax.psum_scatter(attn(h, p["wqkv"], p["wo"]), "tp", scatter_dimension=1, tiled=True)
        h = lax.all_gather(norm(a, p["ln2"]), "tp", axis=1, tiled=True)
        y = jax.nn.gelu(h @ p["w1"]) @ p["w2"]
        return x + a + lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True)

    return jax.shard_map(local, mesh=mesh, in_specs=(SEQ, PSPEC), out_specs=SEQ)(x, p)
