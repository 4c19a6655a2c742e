"""A table computed from its row index, read at integer rows, is the computation on those rows
(equivci.translate.row_tables): RoPE's cos/sin table `cos(arange(N)[:, None] * inv)` read at
`ids` (a gather: `table[ids]`, `jnp.take`) or at `start` (a dynamic slice) is cos(convert(ids) * inv).

Checked against XLA (the stated rows evaluate to what XLA computes for the read), on the bound of
the iota (every integer up to 2^p is a number of a float with p significand bits, the next is not),
on a table read at an index without bounds (nothing stated), and on JAX programs: a reference reading its tables at position ids
against sequence shards computing the angles of their ids on the fly (`table[ids]` and `jnp.take`),
a reference slicing its table at `start` against shards computing theirs; near misses (positions one
late, cos and sin swapped, the halves swapped) are mismatches, and a device reading a table at a
start the reference does not index with (so no bound keeps its rows inside the table: past it HLO
clamps), or a table too short for the starts the reference takes, is never verified.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from jax import lax
from model_package import verify_named as _verify
from one_device import programs

from equivci.results import Status
from equivci.terms.semantics import NP_DTYPES, evaluate
from equivci.translate.row_tables import EXACT_INTEGERS

INV = 1.0 / 10000.0 ** (np.arange(0, 8, 2, dtype=np.float32) / 8)


def _table(n, dtype=jnp.float32):
    return jnp.cos(jnp.arange(n, dtype=dtype)[:, None] * INV[None, :].astype(dtype))


def _rows_stated(fn, args):
    """The terms stated equal to the read (a cosine of the inputs, no gather of a table), evaluated
    on args, and what XLA computes."""
    p, want, _ = programs(fn, args)
    values = {k: np.asarray(a) for k, a in enumerate(args)}
    found = []
    for group in p.evaluator.equal_terms:
        for t in group:
            if t.shape == want.shape and {"cosine", "param"} <= _ops(t) and "aligned" not in _ops(t):
                found.append(evaluate(t, values, p.evaluator.values))
    return found, want


def _ops(t):
    seen, stack = set(), [t]
    while stack:
        u = stack.pop()
        seen.add(u.attrs[0] if u.op == "unary" else u.op)
        stack.extend(u.args)
    return seen


@pytest.mark.parametrize(
    "read",
    [
        lambda ids, start: _table(32)[ids],
        lambda ids, start: jnp.take(_table(32), ids, axis=0),
        lambda ids, start: lax.dynamic_slice_in_dim(_table(32), start, 6),
    ],
)
def test_the_rows_read_are_the_table_computed_on_them(read) -> None:
    ids, start = np.array([3, 0, 31, 7, 7, 12], np.int32), np.int32(9)
    found, want = _rows_stated(lambda ids, start: read(ids, start) + 0 * ids[:, None], (ids, start))
    assert found, "the read has its rows stated"
    for value in found:
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
def test_the_iota_bound_is_where_the_floats_stop_holding_every_integer(dtype) -> None:
    """Every integer up to EXACT_INTEGERS is a number of the dtype, and the one after it is not: an
    iota of more rows may round a row index, and so may a convert, perhaps apart."""
    np_dtype = jnp.bfloat16 if dtype == "bf16" else NP_DTYPES[dtype]
    limit = EXACT_INTEGERS[dtype]
    upto = np.arange(limit - 4, limit + 1, dtype=np.int64)
    assert np.array_equal(upto.astype(np_dtype).astype(np.int64), upto)
    assert int(np.asarray(limit + 1).astype(np_dtype).astype(np.int64)) != limit + 1


def test_a_table_read_at_ids_without_bounds_states_nothing() -> None:
    """A gather's ids an input the reference does not index with (here: ids // 2, whose bounds are
    not kept) have no bounds: a row past the table would be clamped, so no rows are stated."""
    found, _ = _rows_stated(lambda ids: _table(32)[ids // 2], (np.array([3, 0, 31], np.int32),))
    assert not found


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, H, HD, MAX_POS = 2, 8, 2, 8, 32


    def inputs():
        return (jax.ShapeDtypeStruct((B, S, H, HD), jnp.float32), jax.ShapeDtypeStruct((S,), jnp.int32),
                jax.ShapeDtypeStruct((), jnp.int32))


    def _inv():
        return 1.0 / 10000.0 ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)


    def _tables():
        ang = jnp.arange(MAX_POS, dtype=jnp.float32)[:, None] * _inv()[None, :]
        return jnp.cos(ang), jnp.sin(ang)


    def _rotate(x, cos, sin):
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


    def gathered(x, ids, start):
        cos, sin = _tables()
        return _rotate(x, cos[ids][None, :, None, :], sin[ids][None, :, None, :])


    def taken(x, ids, start):
        cos, sin = _tables()
        return _rotate(x, jnp.take(cos, ids, axis=0)[None, :, None, :], jnp.take(sin, ids, axis=0)[None, :, None, :])


    def sliced(x, ids, start):
        cos, sin = _tables()
        cos, sin = lax.dynamic_slice_in_dim(cos, start, S), lax.dynamic_slice_in_dim(sin, start, S)
        return _rotate(x, cos[None, :, None, :], sin[None, :, None, :])


    def on_the_fly(x, ids, start):
        ang = (start + jnp.arange(S)).astype(jnp.float32)[:, None] * _inv()
        return _rotate(x, jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :])


    def _seq(body, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sp"), P("sp"), P()), out_specs=P(None, "sp"))


    def _ids_local(shift=0, swap=False):
        def body(x, ids, start):
            ang = (ids + shift).astype(jnp.float32)[:, None] * _inv()
            c, s = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
            return _rotate(x, s, c) if swap else _rotate(x, c, s)  # MARK:swap
        return body


    def ids_sp(x, ids, start, *, mesh):
        return _seq(_ids_local(), mesh)(x, ids, start)


    def ids_late_sp(x, ids, start, *, mesh):
        return _seq(_ids_local(shift=1), mesh)(x, ids, start)  # MARK:late


    def ids_swapped_sp(x, ids, start, *, mesh):
        return _seq(_ids_local(swap=True), mesh)(x, ids, start)


    def _start_local(shift=0, halves=False):
        def body(x, ids, start):
            rows = x.shape[1]
            pos = start + shift + lax.axis_index("sp") * rows + jnp.arange(rows)
            ang = pos.astype(jnp.float32)[:, None] * _inv()
            c, s = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
            if halves:
                x = jnp.concatenate(jnp.split(x, 2, axis=-1)[::-1], axis=-1)  # MARK:halves
            return _rotate(x, c, s)
        return body


    def start_sp(x, ids, start, *, mesh):
        return _seq(_start_local(), mesh)(x, ids, start)


    def start_late_sp(x, ids, start, *, mesh):
        return _seq(_start_local(shift=1), mesh)(x, ids, start)


    def start_halves_sp(x, ids, start, *, mesh):
        return _seq(_start_local(halves=True), mesh)(x, ids, start)


    def _table_read(positions):
        def body(x, ids, start):
            rows = x.shape[1]
            ang = jnp.arange(positions, dtype=jnp.float32)[:, None] * _inv()[None, :]
            cos, sin = jnp.cos(ang), jnp.sin(ang)
            first = start + lax.axis_index("sp") * rows
            cos, sin = lax.dynamic_slice_in_dim(cos, first, rows), lax.dynamic_slice_in_dim(sin, first, rows)
            return _rotate(x, cos[None, :, None, :], sin[None, :, None, :])
        return body


    def table_read_sp(x, ids, start, *, mesh):
        return _seq(_table_read(MAX_POS), mesh)(x, ids, start)


    def short_table_read_sp(x, ids, start, *, mesh):
        return _seq(_table_read(MAX_POS - 4), mesh)(x, ids, start)  # MARK:short
    """
)

_ROWS = [
    ("gathered-ids", "gathered", "ids_sp"),
    ("taken-ids", "taken", "ids_sp"),
    ("gathered-ids-late", "gathered", "ids_late_sp"),
    ("gathered-ids-swapped", "gathered", "ids_swapped_sp"),
    ("sliced-start", "sliced", "start_sp"),
    ("sliced-start-late", "sliced", "start_late_sp"),
    ("sliced-start-halves", "sliced", "start_halves_sp"),
    ("fly-table-read", "on_the_fly", "table_read_sp"),
    ("sliced-short-table-read", "sliced", "short_table_read_sp"),
]
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: m.py:{ref}, distributed: m.py:{fn}, inputs: m.py:inputs, mesh: {{sp: 2}}}}\n"
    for name, ref, fn in _ROWS
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("row_tables"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["gathered-ids", "taken-ids", "sliced-start"])
def test_tables_read_at_rows_meet_angles_computed_on_the_fly(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize(
    "name", ["gathered-ids-late", "gathered-ids-swapped", "sliced-start-late", "sliced-start-halves"]
)
def test_near_misses_of_the_rows_read_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


@pytest.mark.parametrize("name", ["fly-table-read", "sliced-short-table-read"])
def test_a_table_read_past_its_rows_is_never_verified(manifest, name) -> None:
    """fly-table-read: the reference computes its angles from `start`, the device reads a 32-row
    table at start + 4 * axis_index; for start > 24 HLO clamps the read, and no bound on start says
    it does not happen (the reference indexes nothing with it). sliced-short-table-read: the
    reference's slice bounds start to [0, 24], the device reads a 28-row table at start + 4, which
    clamps for start > 20."""
    result = _verify(manifest, name)
    assert result.status is not Status.VERIFIED, result.findings
