"""The term grammar (equivci/terms/spec.py): every spec reads back as the value that wrote it, and
the strings are byte-for-byte those the evaluator has always written (cache keys and the loader's
tables depend on them)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from equivci.terms.semantics import reshape_out_shape
from equivci.terms.spec import (
    AlignedMap,
    BcastSpec,
    DotSpec,
    GatherDims,
    ReduceSpec,
    ReshapeGroup,
    ReshapeSpec,
    bcast_spec,
    compare_text,
    compose_bcast,
    parse_compare,
    parse_transpose,
    repeat_form,
    reshape_spec,
    transpose_text,
)

dims = st.lists(st.integers(0, 7), max_size=4).map(tuple)
sizes = st.lists(st.integers(1, 64), max_size=3).map(tuple)
dtypes = st.sampled_from(["f32", "bf16", "s32", "pred", "u8"])


@given(dims, dims, dims, dims, st.integers(0, 8), st.integers(0, 8), dtypes, dtypes)
def test_dot_round_trip(lb, rb, lc, rc, lr, rr, a, b) -> None:
    spec = DotSpec(lb, rb, lc, rc, lr, rr, (a, b))
    assert DotSpec.parse(spec.text()) == spec
    assert DotSpec.parse(spec.text()).text() == spec.text()


@given(st.integers(0, 8), st.sets(st.integers(0, 7), max_size=4))
def test_reduce_round_trip(rank, reduced) -> None:
    spec = ReduceSpec(rank, tuple(sorted(reduced)))
    assert ReduceSpec.parse(spec.text()) == spec


@given(st.lists(st.tuples(st.sampled_from("in"), st.integers(0, 99)), max_size=5).map(tuple))
def test_bcast_round_trip(parts) -> None:
    spec = BcastSpec(parts)
    assert BcastSpec.parse(spec.text()) == spec


@given(st.lists(st.tuples(st.integers(0, 3), sizes, st.integers(0, 3), sizes), max_size=4))
def test_reshape_round_trip(groups) -> None:
    spec = ReshapeSpec(tuple(ReshapeGroup(*g) for g in groups))
    assert ReshapeSpec.parse(spec.text()) == spec


@given(st.permutations(range(5)))
def test_transpose_round_trip(perm) -> None:
    assert parse_transpose(transpose_text(perm)) == tuple(perm)


@given(st.sampled_from(["EQ", "NE", "LT", "LE", "GT", "GE"]), dtypes)
def test_compare_round_trip(direction, dtype) -> None:
    assert parse_compare(compare_text(direction, dtype)) == (direction, dtype)
    assert parse_compare("add") is None


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=3).map(tuple),
       st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=3).map(tuple),
       st.lists(st.tuples(st.integers(0, 5), st.integers(1, 9)), max_size=3).map(tuple))
def test_aligned_map_round_trip(lhs, rhs, fixed) -> None:
    tables = AlignedMap(lhs, rhs, fixed)
    key = tables.key("reduce2:abc:[0]:2:[1]:0")
    assert AlignedMap.parse(key) == tables
    assert AlignedMap.op_key(key) == "reduce2:abc:[0]:2:[1]:0"


@given(dims, dims, dims, dims, dims, st.integers(0, 4), sizes)
def test_gather_key_round_trip(offset, collapsed, start_map, operand_batch, indices_batch, vector_dim, slice_sizes):
    g = GatherDims(offset, collapsed, start_map, operand_batch, indices_batch, vector_dim, slice_sizes)
    assert GatherDims.from_key(g.key()) == g


@pytest.mark.parametrize(("spec", "text"), [
    (DotSpec((0,), (0,), (2,), (1,), 3, 3, ("f32", "f32")), "0|0|2|1|3|3|f32,f32"),
    (DotSpec((), (), (1,), (0,), 2, 2, ("bf16", "bf16")), "||1|0|2|2|bf16,bf16"),
    (ReduceSpec(3, (0, 2)), "3:0,2"),
    (ReduceSpec(1, ()), "1:"),
    (BcastSpec.of(2, (4, 2, 3), (2, 0)), "i1,n2,i0"),
    (BcastSpec.of(0, (), ()), ""),
])
def test_the_strings_the_evaluator_has_always_written(spec, text) -> None:
    assert spec.text() == text


def test_shape_constructors() -> None:
    assert bcast_spec(1, (8, 4), (1,)) == "n8,i0"
    assert reshape_spec((2, 3, 4), (6, 4)) == "2:3>1:;1:>1:"
    assert reshape_spec((8,), (1, 8)) == "1:>2:8"
    assert reshape_spec((8,), (1, 8), singletons=True) == "0:>1:;1:>1:"
    assert reshape_spec((6,), (4,)) is None
    assert ReshapeSpec.parse("2:3>1:;1:>1:").tables() == ([(0, 0, 3, 1), (2, 1, 1, 1)], [])
    assert compose_bcast("i0,n4", "n2,i1,i0") == "n2,n4,i0"
    assert repeat_form("1:>1:;2:4>1:;1:>1:", "i0,i1,n4,i2") == (1, 4)
    assert repeat_form("1:>1:;2:4>1:", "i0,n4,i1") is None  # the reshape merges dims 0 and 1, not the new dim with the one before it


def test_a_narrowed_head_split_is_the_split_of_a_window() -> None:
    # [b, s, 32] split as [b, s, 2, 4, 4]; [b, s, 8] split as [b, s, 1, 2, 4] narrows dim 3 to 2:
    # one family (they differ in that size alone), which a split of other head dims is not
    spec = ReshapeSpec.parse(reshape_spec((2, 8, 32), (2, 8, 2, 4, 4)))
    device = ReshapeSpec.parse(reshape_spec((2, 8, 8), (2, 8, 1, 2, 4)))
    other = ReshapeSpec.parse(reshape_spec((2, 8, 16), (2, 8, 2, 4, 2)))
    [(p, m, family)] = spec.narrowings("out")
    assert (p, m) == (3, 4)
    assert device.narrowings("out") == [(3, 2, family)]
    assert other.narrowings("out")[0][2] != family
    # and the merge of [b, s, 2, 4, 4], narrowed along the input's dim 3
    merge = ReshapeSpec.parse(reshape_spec((2, 8, 2, 4, 4), (2, 8, 32)))
    [(p, m, family)] = merge.narrowings("in")
    assert (p, m) == (3, 4)
    assert ReshapeSpec.parse(reshape_spec((2, 8, 1, 2, 4), (2, 8, 8))).narrowings("in") == [(3, 2, family)]


@pytest.mark.parametrize(
    ("in_shape", "out_shape"),
    [((16, 32), (512,)), ((2, 3, 4), (6, 4)), ((4, 1, 6), (4, 6)), ((8,), (1, 8)), ((6, 4), (4, 6)), ((2, 12), (4, 6))],
)
def test_the_inverse_reshape_spec_is_the_reshape_back(in_shape, out_shape) -> None:
    spec = reshape_spec(in_shape, out_shape)
    assert spec is not None
    back = ReshapeSpec.parse(spec).inverse().text()
    assert back == reshape_spec(out_shape, in_shape)
    assert reshape_out_shape(out_shape, back) == in_shape
