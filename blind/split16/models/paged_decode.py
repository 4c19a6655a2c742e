"""One multi-query decode step over a paged KV cache (vLLM-style): per sequence a block table of
page ids into a shared page pool [NUM_PAGES, PAGE, HD] and a context length; 4 query heads share
one kv head; keys at positions >= the context length are masked out.

`ctx` holds context_length - 1 (every sequence has at least one cached token).

Flash-decoding over {kv: 4}: the block table's page columns are split across devices (one logical
page of every sequence per device, positions `axis_index * PAGE + iota`), the page pool is
replicated.

- `decode_split_psum`: a pmax'd running max, psum'd numerator and denominator;
- `decode_split_gather`: each device returns its own (max, sum, unnormalised output); the partials
  are all-gathered and merged with exp(m_i - m) weights.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, H, HD = 4, 4, 16
NUM_PAGES, PAGE, PPS = 16, 4, 4
L = PAGE * PPS
KVP = 4
NEG = -1e30


def decode_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    i = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    return f(B, H, HD), f(NUM_PAGES, PAGE, HD), f(NUM_PAGES, PAGE, HD), i(B, PPS), i(B)


def decode(q, k_pages, v_pages, block_table, ctx):
    k = k_pages[block_table].reshape(B, L, HD)
    v = v_pages[block_table].reshape(B, L, HD)
    s = jnp.einsum("bhd,bld->bhl", q, k) * HD ** -0.5
    valid = jnp.arange(L)[None, :] < (ctx + 1)[:, None]
    s = jnp.where(valid[:, None, :], s, NEG)
    return jnp.einsum("bhl,bld->bhd", jax.nn.softmax(s, axis=-1), v)


def _local_scores(q, k_pages, v_pages, table_col, ctx, inclusive):
    k = k_pages[table_col[:, 0]]
    v = v_pages[table_col[:, 0]]
    pos = lax.axis_index("kv") * PAGE + jnp.arange(PAGE)
    length = ctx + 1
    if inclusive:
        valid = pos[None, :] <= length[:, None]
    else:
        valid = pos[None, :] < length[:, None]
    s = jnp.einsum("bhd,bld->bhl", q, k) * HD ** -0.5
    return jnp.where(valid[:, None, :], s, NEG), valid, v


SPECS = (P(), P(), P(), P(None, "kv"), P())


# ---- psum combine ------------------------------------------------------------------------------------

def _psum_local(q, k_pages, v_pages, table_col, ctx, inclusive=False):
    s, valid, v = _local_scores(q, k_pages, v_pages, table_col, ctx, inclusive)
    m = lax.pmax(s.max(-1, keepdims=True), "kv")
    p = jnp.where(valid[:, None, :], jnp.exp(s - m), 0.0)
    num = lax.psum(jnp.einsum("bhl,bld->bhd", p, v), "kv")
    return num / lax.psum(p.sum(-1), "kv")[..., None]


def decode_split_psum(q, k_pages, v_pages, block_table, ctx, mesh):
    return jax.shard_map(_psum_local, mesh=mesh, in_specs=SPECS, out_specs=P(),
                         check_vma=False)(q, k_pages, v_pages, block_table, ctx)


def decode_split_psum_inclusive(q, k_pages, v_pages, block_table, ctx, mesh):
    local = lambda *a: _psum_local(*a, inclusive=True)
    return jax.shard_map(local, mesh=mesh, in_specs=SPECS, out_specs=P(),
                         check_vma=False)(q, k_pages, v_pages, block_table, ctx)


# ---- gathered partials -------------------------------------------------------------------------------

def _partials(q, k_pages, v_pages, table_col, ctx):
    s, valid, v = _local_scores(q, k_pages, v_pages, table_col, ctx, False)
    m = s.max(-1)
    p = jnp.where(valid[:, None, :], jnp.exp(s - m[..., None]), 0.0)
    o = jnp.einsum("bhl,bld->bhd", p, v)
    return lax.all_gather((m, p.sum(-1), o), "kv")


def merge_partials(m, l, o):
    m_all = m.max(0)
    w = jnp.exp(m - m_all)
    return (w[..., None] * o).sum(0) / (w * l).sum(0)[..., None]


def merge_partials_unweighted(m, l, o):
    return o.sum(0) / l.sum(0)[..., None]


def _gathered(merge, q, k_pages, v_pages, block_table, ctx, mesh):
    local = lambda *a: merge(*_partials(*a))
    return jax.shard_map(local, mesh=mesh, in_specs=SPECS, out_specs=P(),
                         check_vma=False)(q, k_pages, v_pages, block_table, ctx)


def decode_split_gather(q, k_pages, v_pages, block_table, ctx, mesh):
    return _gathered(merge_partials, q, k_pages, v_pages, block_table, ctx, mesh)


def decode_split_gather_unweighted(q, k_pages, v_pages, block_table, ctx, mesh):
    return _gathered(merge_partials_unweighted, q, k_pages, v_pages, block_table, ctx, mesh)
