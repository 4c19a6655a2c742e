"""Llama-4-style chunked local attention: a query attends causally to the keys of its own
attention chunk only (chunks of CHUNK = 8 consecutive positions; mask `k <= q and k // 8 == q // 8`).
One multi-head attention sub-layer with its residual, S = 16.

`chunked_sp` on {dp: 2, sp: 4}: batch over dp, the sequence over sp (4 tokens per device, so a chunk
spans two devices); K / V are all-gathered over sp, the device's query positions are
`axis_index("sp") * S_LOCAL + iota` and both the causal test and the chunk test use them.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, NH = 4, 16, 32, 4
HD = D // NH
CHUNK = 8
SP = 4
S_LOCAL = S // SP


def chunk_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, NH, HD), "wk": f(D, NH, HD), "wv": f(D, NH, HD), "wo": f(NH, HD, D)}, f(B, S, D)


def _attend(p, x_q, x_kv, allowed):
    q = jnp.einsum("bsd,dnh->bsnh", x_q, p["wq"])
    k = jnp.einsum("bsd,dnh->bsnh", x_kv, p["wk"])
    v = jnp.einsum("bsd,dnh->bsnh", x_kv, p["wv"])
    logits = jnp.einsum("bqnh,bknh->bnqk", q, k) * HD ** -0.5
    probs = jax.nn.softmax(jnp.where(allowed, logits, -1e9), axis=-1)
    return x_q + jnp.einsum("bnqk,bknh,nhd->bqd", probs, v, p["wo"])


def chunked_attention(p, x):
    q_pos = jnp.arange(S)[:, None]
    k_pos = jnp.arange(S)[None, :]
    allowed = (k_pos <= q_pos) & (k_pos // CHUNK == q_pos // CHUNK)
    return _attend(p, x, x, allowed)


def chunked_sp(p, x, mesh):
    def local(p, x):
        x_all = lax.all_gather(x, "sp", axis=1, tiled=True)
        q_pos = (lax.axis_index("sp") * S_LOCAL + jnp.arange(S_LOCAL))[:, None]
        k_pos = jnp.arange(S)[None, :]
        allowed = (k_pos <= q_pos) & (k_pos // CHUNK == q_pos // CHUNK)
        return _attend(p, x, x_all, allowed)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp", "sp")), out_specs=P("dp", "sp"),
                         check_vma=False)(p, x)


def chunked_sp_local_chunk_ids(p, x, mesh):
    def local(p, x):
        x_all = lax.all_gather(x, "sp", axis=1, tiled=True)
        q_pos = (lax.axis_index("sp") * S_LOCAL + jnp.arange(S_LOCAL))[:, None]
        k_pos = jnp.arange(S)[None, :]
        q_chunk = jnp.arange(S_LOCAL)[:, None] // CHUNK
        allowed = (k_pos <= q_pos) & (k_pos // CHUNK == q_chunk)
        return _attend(p, x, x_all, allowed)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp", "sp")), out_specs=P("dp", "sp"),
                         check_vma=False)(p, x)
