"""Dynamic slices at `start + axis_index * rows`: an integer input the reference uses as a slice
start is a valid start, [0, n - size]; a start offset from it by a constant is then a window of
one dynamic slice at the input, when no value of the input makes HLO clamp (translate/offsets.py).
Styles: a table sliced with `dynamic_slice_in_dim` per device (sequence over one axis), a 2-D
`lax.dynamic_slice` with the offset written as `(start + idx) * rows`-free arithmetic, the
reference's own window sliced again per device, positions `start + arange(n)` gathered with
`jnp.take` (a gather of consecutive rows is that window, bounds.offset_input gives the input's
range); near misses that differ only where the fact's
side conditions matter (a missing or extra offset, a wider window that clamps where the reference
does not); a start the reference offsets by a constant bounds its input, shifted."""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.translate import offsets
from equivci.translate.evaluator import Evaluator

MODELS = textwrap.dedent(
    """\
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    N, T, D = 24, 8, 4
    TABLE = np.sin(np.arange(N * D, dtype=np.float32).reshape(N, D) / 7.0)


    def inputs():
        return (jax.ShapeDtypeStruct((T, D), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32))


    def scaled(x, start):
        return x * lax.dynamic_slice_in_dim(jnp.asarray(TABLE), start, T)


    def _per_device(x, start, mesh, first, rows_read=None):
        def body(xs, start):
            rows = xs.shape[0]
            table = lax.dynamic_slice_in_dim(jnp.asarray(TABLE), first(start, lax.axis_index("sp"), rows),
                                             rows_read or rows)
            return xs * table[:rows]

        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, start)


    def scaled_sp(x, start, *, mesh):
        return _per_device(x, start, mesh, lambda s, i, rows: s + i * rows)


    def scaled_sp_ahead(x, start, *, mesh):
        return _per_device(x, start, mesh, lambda s, i, rows: s + i * rows + 1)  # MARK:ahead


    def scaled_sp_no_start(x, start, *, mesh):
        return _per_device(x, start, mesh, lambda s, i, rows: i * rows)  # MARK:no_start


    def scaled_sp_wide(x, start, *, mesh):
        # reads 4 * rows rows and keeps the first: HLO clamps that start where the reference's does not
        return _per_device(x, start, mesh, lambda s, i, rows: s + i * rows, rows_read=2 * T)  # MARK:wide


    def scaled_2d(x, start, *, mesh):
        def body(xs, start):
            first = (lax.axis_index("sp") * 2 + 1) * (xs.shape[0] // 2) - xs.shape[0] // 2 + start
            table = lax.dynamic_slice(jnp.asarray(TABLE), (first, 0), xs.shape)
            return xs * table

        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, start)


    def scaled_resliced(x, start, *, mesh):
        def body(xs, start):
            mine = lax.dynamic_slice_in_dim(jnp.asarray(TABLE), start, T)
            rows = lax.dynamic_slice_in_dim(mine, lax.axis_index("sp") * xs.shape[0], xs.shape[0])
            return xs * rows

        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, start)


    def taken(x, start):
        return x * jnp.take(jnp.asarray(TABLE), start + jnp.arange(T), axis=0)


    def _taken_sp(x, start, mesh, order):
        def body(xs, start):
            rows = xs.shape[0]
            pos = start + lax.axis_index("sp") * rows + order(jnp.arange(rows))
            return xs * jnp.take(jnp.asarray(TABLE), pos, axis=0)

        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, start)


    def taken_sp(x, start, *, mesh):
        return _taken_sp(x, start, mesh, lambda r: r)


    def taken_sp_swapped(x, start, *, mesh):
        # the last two positions of each device swapped: not consecutive rows, though they start and end there
        return _taken_sp(x, start, mesh, lambda r: jnp.concatenate([r[:-2], r[-1:], r[-2:-1]]))  # MARK:swapped


    def shifted(x, start):
        # the reference never uses `start` itself as a slice start, only start + 2: no bounds for it
        return x * lax.dynamic_slice_in_dim(jnp.asarray(TABLE), start + 2, T)


    def shifted_sp(x, start, *, mesh):
        return _per_device(x, start, mesh, lambda s, i, rows: s + 2 + i * rows)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: sp, reference: m.py:scaled, distributed: m.py:scaled_sp, inputs: m.py:inputs, mesh: {sp: 2}}
      - {name: sp4, reference: m.py:scaled, distributed: m.py:scaled_sp, inputs: m.py:inputs, mesh: {sp: 4}}
      - {name: two-dim, reference: m.py:scaled, distributed: m.py:scaled_2d, inputs: m.py:inputs, mesh: {sp: 2}}
      - {name: resliced, reference: m.py:scaled, distributed: m.py:scaled_resliced, inputs: m.py:inputs,
         mesh: {sp: 4}}
      - {name: take, reference: m.py:taken, distributed: m.py:taken_sp, inputs: m.py:inputs, mesh: {sp: 2}}
      - {name: take-vs-slice, reference: m.py:scaled, distributed: m.py:taken_sp, inputs: m.py:inputs, mesh: {sp: 4}}
      - {name: take-swapped, reference: m.py:taken, distributed: m.py:taken_sp_swapped, inputs: m.py:inputs,
         mesh: {sp: 2}}
      - {name: ahead, reference: m.py:scaled, distributed: m.py:scaled_sp_ahead, inputs: m.py:inputs, mesh: {sp: 2}}
      - {name: no-start, reference: m.py:scaled, distributed: m.py:scaled_sp_no_start, inputs: m.py:inputs,
         mesh: {sp: 2}}
      - {name: wide, reference: m.py:scaled, distributed: m.py:scaled_sp_wide, inputs: m.py:inputs, mesh: {sp: 2}}
      - {name: unbounded, reference: m.py:shifted, distributed: m.py:shifted_sp, inputs: m.py:inputs, mesh: {sp: 2}}
    """
)

EQUIVALENT = ["sp", "sp4", "two-dim", "resliced", "take", "take-vs-slice"]
NEAR_MISSES = ["ahead", "no-start", "wide", "take-swapped"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("offsets"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", EQUIVALENT)
def test_offset_slices_verify(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings
    notes = [f.message for f in result.findings if f.severity == "note"]
    assert any("in [0, 16]" in m for m in notes), notes  # the assumption is reported


@pytest.mark.parametrize("name", NEAR_MISSES)
def test_offset_near_misses_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


def test_a_start_offset_by_a_constant_bounds_the_input_it_is_made_of(manifest):
    """The reference slices at `start + 2`: it is a valid start for start in [-2, n - size - 2],
    and only there. The proof takes that range (and says so in its note); the programs agree on
    every start inside it and differ just outside, where HLO clamps the reference's start and not
    the devices' (so no proof could cover those values, and none claims to)."""
    from equivci.capture.oracle import compare_in_child

    result = _verify(manifest, "unbounded")
    assert result.status is Status.VERIFIED, result.findings
    assert [f.message.split(":")[0] for f in result.findings] == ["proved for input [1] in [-2, 14]"]
    seeds = tuple(range(6))
    assert compare_in_child(manifest.path, "unbounded", seeds, ranges={1: (-2, 15)}).equal
    assert not compare_in_child(manifest.path, "unbounded", seeds, ranges={1: (15, 17)}).equal


def _evaluator_with_start(lo: int, hi: int):
    ev = Evaluator(None, TermTable(), 1)
    start = ev.table.make("param", (1,), (), (), "s32")
    ev.bounds[start] = (float(lo), float(hi))
    x = ev.table.make("param", (0,), (), (24, 4), "f32")
    return ev, start, x


@pytest.mark.parametrize("lo,hi,c,size", [(0, 16, 0, 8), (0, 8, 8, 8), (3, 10, -3, 6), (2, 2, 5, 4), (0, 20, 0, 4)])
def test_offset_window_is_the_clamped_dynamic_slice(lo, hi, c, size):
    """The window form of dslice(x, base + c, size) equals HLO's clamped dynamic slice for every
    value of the base in its bounds (numpy semantics of the terms, against numpy's own slicing)."""
    from equivci.terms.semantics import evaluate

    ev, start, x = _evaluator_with_start(lo, hi)
    offset = ev.binary("add", start, ev.const(np.asarray(c, dtype=np.int32), "s32"))
    term = offsets.window(ev, x, 0, offset, size)
    assert term is not None
    table = np.arange(24 * 4, dtype=np.float32).reshape(24, 4)
    for s in range(lo, hi + 1):
        begin = int(np.clip(s + c, 0, 24 - size))
        got = evaluate(term, {0: table, 1: np.asarray(s, dtype=np.int32)}, ev.values)
        np.testing.assert_array_equal(got, table[begin : begin + size])


@pytest.mark.parametrize("lo,hi,c,size", [(0, 17, 0, 8), (0, 16, 9, 8), (1, 10, -2, 6)])
def test_offset_window_refuses_a_start_that_may_clamp(lo, hi, c, size):
    """Where some value of the base would make HLO clamp the start, no window form is built."""
    ev, start, x = _evaluator_with_start(lo, hi)
    offset = ev.binary("add", start, ev.const(np.asarray(c, dtype=np.int32), "s32"))
    assert offsets.window(ev, x, 0, offset, size) is None


@pytest.mark.parametrize("op", ["add", "subtract", "multiply"])
def test_affine_bounds_hold_every_result(op):
    """The interval arithmetic of bounds.bound_affine: every result of the op on values inside its
    operands' bounds lies inside the result's bounds (signed ends included), and none are kept
    where the dtype could wrap."""
    from equivci.terms import semantics
    from equivci.translate.bounds import bound_affine

    rng = np.random.default_rng(0)
    for _ in range(40):
        ev = Evaluator(None, TermTable(), 1)
        a, b = (ev.table.make("param", (k,), (), (), "s32") for k in (0, 1))
        ends = [sorted(rng.integers(-9, 10, 2)) for _ in (a, b)]
        for t, (lo, hi) in zip((a, b), ends):
            ev.bounds[t] = (float(lo), float(hi))
        result = ev.binary(op, a, b)
        bound_affine(ev, result, op, a, b)
        lo, hi = ev.bounds[result]
        values = [
            semantics.BINARY[op](np.int32(x), np.int32(y))
            for x in range(ends[0][0], ends[0][1] + 1)
            for y in range(ends[1][0], ends[1][1] + 1)
        ]
        assert lo == min(values) and hi == max(values), (op, ends, (lo, hi))
    ev = Evaluator(None, TermTable(), 1)
    a, b = (ev.table.make("param", (k,), (), (), "s32") for k in (0, 1))
    ev.bounds[a], ev.bounds[b] = (0.0, 2.0**30), (0.0, 4.0)
    wrapped = ev.binary("multiply", a, b)
    bound_affine(ev, wrapped, "multiply", a, b)
    assert wrapped not in ev.bounds  # 2**32 does not fit an s32: the product may wrap


def test_an_integer_offset_taken_back_is_the_value_itself():
    """(x + c) - c and (x - c) + c are x on integers, exactly, overflow included (it wraps back): an
    index made with an offset and taken back meets the index itself. Not for floats (rounding),
    nor for another constant."""
    from equivci.hlo.ir import Instruction, Shape

    ev = Evaluator(None, TermTable(), 1)
    op = lambda name, a, b: ev.local(Instruction("e", name, Shape(a.dtype, (6,)), ("a", "b"), {}), [a, b], 0)  # noqa: E731
    c = lambda v, dtype="s8": ev.const(np.full((6,), v, {"s8": np.int8, "f32": np.float32}[dtype]), dtype)  # noqa: E731
    x = ev.table.make("param", (0,), (), (6,), "s8")
    assert op("subtract", op("add", x, c(100)), c(100)) is x
    assert op("add", op("subtract", x, c(100)), c(100)) is x
    assert op("subtract", op("add", x, c(100)), c(99)) is not x
    floats = ev.table.make("param", (1,), (), (6,), "f32")
    assert op("subtract", op("add", floats, c(3, "f32")), c(3, "f32")) is not floats
    values = np.arange(-128, 128).astype(np.int8)
    with np.errstate(over="ignore"):
        assert np.array_equal((values + np.int8(100)) - np.int8(100), values)  # the wrap goes back


def test_offset_input_sums_the_constants_at_every_level_and_not_a_negated_input():
    """`bcast(start - 3) + arange(4)` is start + [-3, -2, -1, 0] exactly (the window before a
    position); `3 - start` is no constant offset of start (its range is reversed)."""
    from equivci.hlo.ir import Shape
    from equivci.translate.bounds import offset_input
    from equivci.translate.shapes import broadcast_term

    ev, start, _ = _evaluator_with_start(0, 15)
    three = ev.const(np.asarray(3, dtype=np.int32), "s32")
    before = ev.binary("subtract", start, three)
    window = ev.binary("add", broadcast_term(ev, before, Shape("s32", (4,)), ()), ev.const(np.arange(4, dtype=np.int32), "s32"))
    base, c = offset_input(ev, window)
    assert base is start and c.tolist() == [-3, -2, -1, 0]
    negated = ev.binary("subtract", three, start)
    base, c = offset_input(ev, negated)
    assert base is negated and c.tolist() == [0]
