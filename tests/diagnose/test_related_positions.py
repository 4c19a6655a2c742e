"""A value computed from no input that the proof relates to the reference's own is right: the op that
uses it stays the finding. A flash-decoding step over a paged KV cache (page columns over `kv`) keeps
keys up to and including the context length: the device's positions `axis_index * PAGE + iota` are a
window of the reference's, so the `<=` that tests them leads, not the line that computes them. Near
miss: the same step with `<` is never `mismatch`."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
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
            valid = pos[None, :] <= length[:, None]  # MARK:inclusive
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
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:decode, distributed: model.py:{func}, inputs: model.py:decode_inputs, "
    "mesh: {kv: 4}}\n"
    for name, func in [("psum", "decode_split_psum"), ("psum-inclusive", "decode_split_psum_inclusive")]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("related_positions"), "model.py", MODEL, MANIFEST)


def test_near_miss_the_strict_test_is_no_mismatch(manifest):
    assert verify_named(manifest, "psum").status != Status.MISMATCH


def test_the_test_of_related_positions_leads(manifest):
    result = verify_named(manifest, "psum-inclusive")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "inclusive")), result.findings
