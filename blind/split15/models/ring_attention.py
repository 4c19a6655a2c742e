"""Causal self-attention sub-layer (projections, 2 heads, residual) with context parallelism over the
sequence on {cp: 4}: each device holds S/4 consecutive tokens.

- `attn_ring`: ring attention; K/V blocks travel around the ring with `lax.ppermute`, each step
  masks with the global positions of the visiting block and folds it into an online softmax
  (running max, denominator, accumulator);
- `attn_gathered`: K/V all-gathered over `cp`, queries masked at their global positions.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 2, 16, 16, 2, 8
CP = 4
S_LOCAL = S // CP
NEG = -1e30


def cp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H * HD), "wk": f(D, H * HD), "wv": f(D, H * HD), "wo": f(H * HD, D)}, f(B, S, D)


def _split_heads(t):
    return t.reshape(t.shape[0], t.shape[1], H, HD)


def _qkv(p, x):
    return (_split_heads(x @ p[n]) for n in ("wq", "wk", "wv"))


def causal_attention_layer(p, x):
    q, k, v = _qkv(p, x)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(HD))
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, NEG)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return x + o.reshape(B, S, H * HD) @ p["wo"]


def _finish(p, x, o):
    return x + o.reshape(B, S_LOCAL, H * HD) @ p["wo"]


# ---- ring attention -----------------------------------------------------------------------------

def _ring_local(p, x, source_block):
    idx = lax.axis_index("cp")
    q, k, v = _qkv(p, x)
    q = q / jnp.sqrt(jnp.float32(HD))
    q_pos = idx * S_LOCAL + jnp.arange(S_LOCAL)
    m = jnp.full((B, H, S_LOCAL), NEG)
    l = jnp.zeros((B, H, S_LOCAL))
    acc = jnp.zeros((B, H, S_LOCAL, HD))
    for step in range(CP):
        src = source_block(idx, step)
        k_pos = src * S_LOCAL + jnp.arange(S_LOCAL)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
        m_new = jnp.maximum(m, s.max(axis=-1))
        corr = jnp.exp(m - m_new)
        w = jnp.exp(s - m_new[..., None])
        l = l * corr + w.sum(axis=-1)
        acc = acc * corr[..., None] + jnp.einsum("bhqk,bkhd->bhqd", w, v)
        m = m_new
        shift = [(i, (i + 1) % CP) for i in range(CP)]
        k, v = lax.ppermute(k, "cp", shift), lax.ppermute(v, "cp", shift)
    o = (acc / l[..., None]).transpose(0, 2, 1, 3)
    return _finish(p, x, o)


def _came_from_behind(idx, step):
    return (idx - step) % CP


def _came_from_ahead(idx, step):
    return (idx + step) % CP


def _ring(source_block, p, x, mesh):
    return jax.shard_map(lambda p, x: _ring_local(p, x, source_block), mesh=mesh,
                         in_specs=(P(), P(None, "cp")), out_specs=P(None, "cp"),
                         check_vma=False)(p, x)


def attn_ring(p, x, mesh):
    return _ring(_came_from_behind, p, x, mesh)


def attn_ring_wrong_source(p, x, mesh):
    return _ring(_came_from_ahead, p, x, mesh)


# ---- all-gathered K/V ---------------------------------------------------------------------------

def _gathered_local(p, x):
    q, k, v = _qkv(p, x)
    k = lax.all_gather(k, "cp", axis=1, tiled=True)
    v = lax.all_gather(v, "cp", axis=1, tiled=True)
    q_pos = lax.axis_index("cp") * S_LOCAL + jnp.arange(S_LOCAL)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(HD))
    s = jnp.where(q_pos[:, None] >= jnp.arange(S)[None, :], s, NEG)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return _finish(p, x, o)


def _gathered_local_no_offset(p, x):
    q, k, v = _qkv(p, x)
    k = lax.all_gather(k, "cp", axis=1, tiled=True)
    v = lax.all_gather(v, "cp", axis=1, tiled=True)
    q_pos = jnp.arange(S_LOCAL)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(HD))
    s = jnp.where(q_pos[:, None] >= jnp.arange(S)[None, :], s, NEG)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return _finish(p, x, o)


def _gathered(local, p, x, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "cp")), out_specs=P(None, "cp"),
                         check_vma=False)(p, x)


def attn_gathered(p, x, mesh):
    return _gathered(_gathered_local, p, x, mesh)


def attn_gathered_no_offset(p, x, mesh):
    return _gathered(_gathered_local_no_offset, p, x, mesh)
