"""Padding-aware learned positions (Hugging Face style): position_ids = cumsum(attention_mask) - 1,
pads get position 0; the embedding is tok_emb[tokens] + pos_emb[position_ids], then LayerNorm.
Sequence parallel: a chunk's positions start at the number of real tokens in the chunks before it.

- `embed_sp_gathered_counts`: shard_map on {sp: 4}; each chunk's real-token count is
  all-gathered and the counts of the chunks before `axis_index` are summed;
- `embed_dp_sp_psum_counts`: on {dp: 2, sp: 4}; the offset is a psum of each device's count
  masked by whether the device lies before this one (one-hot over the sp axis).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, V = 4, 16, 16, 32


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return ({"tok": f(V, D), "pos": f(T, D), "g": f(D), "b": f(D)},
            jax.ShapeDtypeStruct((B, T), jnp.int32), jax.ShapeDtypeStruct((B, T), jnp.bool_))


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b


def _embed(p, tokens, mask, positions):
    positions = jnp.where(mask, positions, 0)
    return layer_norm(p["tok"][tokens] + p["pos"][positions], p["g"], p["b"])


def embed(p, tokens, mask):
    return _embed(p, tokens, mask, jnp.cumsum(mask, axis=1) - 1)


def _specs(spec):
    return ({"tok": P(), "pos": P(), "g": P(), "b": P()}, spec, spec)


# ---- gathered counts -----------------------------------------------------------------------------

def _gathered_local(p, tokens, mask, strictly_before):
    me = lax.axis_index("sp")
    counts = lax.all_gather(jnp.sum(mask, axis=1), "sp", axis=1)  # [b, n]
    devices = jnp.arange(counts.shape[1])
    before = strictly_before(devices, me)
    offset = jnp.sum(jnp.where(before, counts, 0), axis=1, keepdims=True)
    return _embed(p, tokens, mask, offset + jnp.cumsum(mask, axis=1) - 1)


def _before(devices, me):
    return devices < me


def _before_or_self(devices, me):
    return devices <= me


def _run_gathered(p, tokens, mask, mesh, strictly_before):
    local = lambda p, t, m: _gathered_local(p, t, m, strictly_before)
    spec = P(None, "sp")
    return jax.shard_map(local, mesh=mesh, in_specs=_specs(spec), out_specs=spec,
                         check_vma=False)(p, tokens, mask)


def embed_sp_gathered_counts(p, tokens, mask, mesh):
    return _run_gathered(p, tokens, mask, mesh, _before)


def embed_sp_gathered_counts_inclusive(p, tokens, mask, mesh):
    return _run_gathered(p, tokens, mask, mesh, _before_or_self)


# ---- psum of masked counts -----------------------------------------------------------------------

def _psum_offset(mask):
    me = lax.axis_index("sp")
    n = lax.axis_size("sp")
    mine = jax.nn.one_hot(me, n, dtype=jnp.int32) * jnp.sum(mask, axis=1, keepdims=True)  # [b, n]
    counts = lax.psum(mine, "sp")
    return jnp.sum(jnp.where(jnp.arange(n) < me, counts, 0), axis=1, keepdims=True)


def _chunk_offset_ignoring_pads(mask):
    return lax.axis_index("sp") * mask.shape[1]


def _psum_local(p, tokens, mask, offset):
    return _embed(p, tokens, mask, offset(mask) + jnp.cumsum(mask, axis=1) - 1)


def _run_psum(p, tokens, mask, mesh, offset):
    local = lambda p, t, m: _psum_local(p, t, m, offset)
    spec = P("dp", "sp")
    return jax.shard_map(local, mesh=mesh, in_specs=_specs(spec), out_specs=spec,
                         check_vma=False)(p, tokens, mask)


def embed_dp_sp_psum_counts(p, tokens, mask, mesh):
    return _run_psum(p, tokens, mask, mesh, _psum_offset)


def embed_dp_sp_offset_ignores_padding(p, tokens, mask, mesh):
    return _run_psum(p, tokens, mask, mesh, _chunk_offset_ignoring_pads)
