"""Gathers at an index reshaped, and a one-coordinate index vector made implicit
(equivci.translate.gathers.reshaped_index, GatherDims.without_unit_index_dims): a paged KV cache
read one page column per device, `pages[table[:, d:d + 1][:, 0]]`, is the window of the reference's
`pages[table]`.

HLO semantics checked against XLA: every term stated equal to such a gather evaluates to what XLA
computes for it (one page column, a column kept 2-D, a flattened index, a transposed one); the normal
form reads `x[ids]` at its index with no size-1 dims. End to end on kv shards (a page column per
device, read by advanced indexing and by `jnp.take(..., axis=0)`, scores against the pages read;
batch shards reading a flattened lookup): verified; near misses (every page one later, the columns
reversed, each device reading its next device's column) are mismatches.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from jax import lax
from model_package import verify_named as _verify
from one_device import programs

from equivci.results import Status
from equivci.terms.semantics import evaluate
from equivci.terms.spec import GatherDims

PAGES = np.random.default_rng(0).standard_normal((16, 4, 8)).astype(np.float32)
# unsigned: no wrap of negative indices stands between the gather and the reshape of its index
TABLE = np.array([[3, 0, 15, 7], [7, 7, 1, 2], [9, 12, 4, 5], [0, 1, 2, 3]], np.uint32)


def _stated(fn, args):
    """Every term stated equal to a gather's term, evaluated on args (the gather's own included),
    and what XLA computes for fn."""
    p, want, _ = programs(fn, args)
    values = {k: np.asarray(a) for k, a in enumerate(args)}
    found = []
    for group in p.evaluator.equal_terms:
        if any(t.op == "aligned" and t.attrs[0].startswith("gather:") for t in group):
            found.append([evaluate(t, values, p.evaluator.values) for t in group])
    return found, want


def _rows(pages, idx):
    """pages[idx[:, 0]] as one plain gather (jnp's indexing converts a flattened unsigned index)."""
    batch = idx.ndim - 1
    dims = lax.GatherDimensionNumbers(offset_dims=(batch, batch + 1), collapsed_slice_dims=(0,), start_index_map=(0,))
    return lax.gather(pages, idx, dims, (1, *pages.shape[1:]), mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)


@pytest.mark.parametrize(
    ("read", "reshaped"),
    [
        (lambda pages, table: pages[table[:, 1:2][:, 0]], True),
        (lambda pages, table: pages[table[:, 2:3]], True),
        (lambda pages, table: _rows(pages, table.reshape(-1, 1)), True),
        (lambda pages, table: _rows(pages, table.T.reshape(-1, 1)), True),
        (lambda pages, table: _rows(pages, table.T[..., None]), False),  # a transpose moves no rows out
    ],
    ids=["page-column", "column-kept", "flattened", "flattened-transposed", "transposed"],
)
def test_a_gather_at_a_reshaped_index_is_the_reshaped_gather(read, reshaped) -> None:
    found, want = _stated(lambda pages, table: read(pages, table) + 0 * pages[0, 0, 0], (PAGES, TABLE))
    assert any(len(group) > 1 for group in found) == reshaped, "the gather has its reshaped form stated"
    for group in found:
        for value in group:
            assert value.size == want.size
            np.testing.assert_array_equal(value.reshape(want.shape), want)


def test_a_one_coordinate_index_vector_is_made_implicit() -> None:
    """`pages[table]` lowers with an explicit index vector of size 1 ([4, 4, 1], vector dim 2): the
    normal form reads it at [4, 4] with the vector implicit (vector dim = rank), as a column's
    [4] after its size-1 dim is dropped."""
    p, want, _ = programs(lambda pages, table: pages[table], (PAGES, TABLE))
    (out,) = p.reference_outputs
    gathers = [t for t in _subterms(out) if t.op == "aligned"]
    assert gathers
    for t in gathers:
        dims = GatherDims.from_key(t.attrs[0].split("|")[0])
        assert dims.vector_dim == len(t.args[1].shape) and t.args[1].shape == TABLE.shape
    np.testing.assert_array_equal(evaluate(out, {0: PAGES, 1: TABLE}, p.evaluator.values), want)


def test_a_multi_coordinate_index_vector_is_kept() -> None:
    """x[i, j] reads one element at a two-coordinate index vector: it stays explicit, and the term
    still computes what XLA does."""
    rows, cols = np.array([3, 0, 15], np.int32), np.array([1, 3, 0], np.int32)
    p, want, _ = programs(lambda pages, r, c: pages[r, c], (PAGES, rows, cols))
    (out,) = p.reference_outputs
    for t in _subterms(out):
        if t.op == "aligned":
            assert GatherDims.from_key(t.attrs[0].split("|")[0]).vector_dim < len(t.args[1].shape)
    np.testing.assert_array_equal(evaluate(out, {0: PAGES, 1: rows, 2: cols}, p.evaluator.values), want)


def _subterms(t):
    seen, stack = [], [t]
    while stack:
        u = stack.pop()
        seen.append(u)
        stack.extend(u.args)
    return seen


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, NUM_PAGES, PAGE, HD, PPS, T, V = 4, 16, 4, 8, 4, 8, 32


    def inputs():
        return (jax.ShapeDtypeStruct((B, HD), jnp.float32), jax.ShapeDtypeStruct((NUM_PAGES, PAGE, HD), jnp.float32),
                jax.ShapeDtypeStruct((B, PPS), jnp.int32))


    def scores(q, pages, table):
        k = pages[table].reshape(B, PPS * PAGE, HD)
        return jnp.einsum("bd,bld->bl", q, k)


    def _kv(body, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(None, "kv")), out_specs=P(None, "kv"))


    def _column(read):
        return lambda q, pages, col: jnp.einsum("bd,bld->bl", q, read(pages, col))


    def indexed_kv(q, pages, table, *, mesh):
        return _kv(_column(lambda pages, col: pages[col[:, 0]]), mesh)(q, pages, table)


    def taken_kv(q, pages, table, *, mesh):
        return _kv(_column(lambda pages, col: jnp.take(pages, col, axis=0)[:, 0]), mesh)(q, pages, table)


    def next_page_kv(q, pages, table, *, mesh):
        return _kv(_column(lambda pages, col: pages[col[:, 0] + 1]), mesh)(q, pages, table)  # MARK:next


    def reversed_kv(q, pages, table, *, mesh):
        return _kv(_column(lambda pages, col: pages[col[:, 0]]), mesh)(q, pages, table[:, ::-1])


    def neighbour_kv(q, pages, table, *, mesh):
        def body(q, pages, col):
            mine = lax.ppermute(col, "kv", [(d, (d - 1) % 4) for d in range(4)])
            return jnp.einsum("bd,bld->bl", q, pages[mine[:, 0]])
        return _kv(body, mesh)(q, pages, table)


    def lookup_inputs():
        return jax.ShapeDtypeStruct((V, HD), jnp.float32), jax.ShapeDtypeStruct((B, T), jnp.int32)


    def lookup(emb, ids):
        return emb[ids]


    def flat_lookup_dp(emb, ids, *, mesh):
        body = lambda emb, ids: emb[ids.reshape(-1)].reshape(*ids.shape, HD)
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("kv")), out_specs=P("kv"))(emb, ids)


    def flat_lookup_reversed_dp(emb, ids, *, mesh):
        body = lambda emb, ids: emb[ids.reshape(-1)].reshape(*ids.shape, HD)[:, ::-1]
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("kv")), out_specs=P("kv"))(emb, ids)
    """
)

_ROWS = [
    ("indexed", "scores", "indexed_kv", "inputs"),
    ("taken", "scores", "taken_kv", "inputs"),
    ("next-page", "scores", "next_page_kv", "inputs"),
    ("reversed", "scores", "reversed_kv", "inputs"),
    ("neighbour", "scores", "neighbour_kv", "inputs"),
    ("flat-lookup", "lookup", "flat_lookup_dp", "lookup_inputs"),
    ("flat-lookup-reversed", "lookup", "flat_lookup_reversed_dp", "lookup_inputs"),
]
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: m.py:{ref}, distributed: m.py:{fn}, inputs: m.py:{inp}, mesh: {{kv: 4}}}}\n"
    for name, ref, fn, inp in _ROWS
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("paged_reads"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["indexed", "taken", "flat-lookup"])
def test_a_page_column_read_on_its_device_is_the_window_of_the_reference_read(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["next-page", "reversed", "neighbour", "flat-lookup-reversed"])
def test_near_misses_of_the_page_read_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
