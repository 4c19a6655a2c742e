"""The numpy semantics of terms (equivci/terms/semantics.py) against XLA itself: each op's term is
evaluated on random inputs and compared with jax.lax / jax.numpy on the same inputs.

The rule checks evaluate both sides of an identity with these semantics, so a wrong meaning of an
op agrees with itself there; the oracle's inputs never meet these semantics either. This is the
independent check: a term must mean what the HLO op it stands for computes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from equivci.terms.ir import TermTable
from equivci.terms.semantics import BINARY as MODELLED_BINARY
from equivci.terms.semantics import UNARY as MODELLED_UNARY
from equivci.terms.semantics import evaluate
from equivci.terms.spec import AlignedMap, DotSpec, GatherDims, ReduceSpec, bcast_spec, compare_text, reshape_spec

RNG = np.random.default_rng(12)
X = RNG.standard_normal((3, 4)).astype(np.float32) * 3
X[0, :3] = [2.5, -2.5, 0.5]  # halves: the two roundings differ there
POSITIVE = np.abs(X) + 0.25
INTS = RNG.integers(-50, 50, (3, 4)).astype(np.int32)
BOOLS = RNG.random((3, 4)) < 0.5
COMPLEX = (X + 1j * X.T.reshape(3, 4)).astype(np.complex64)


def _term(t: TermTable, op: str, attrs: tuple, values: list[np.ndarray], shape, dtype: str):
    """The term op(attrs)(param 0, param 1, ...) and the params' values."""
    dtypes = {
        np.dtype(np.float32): "f32",
        np.dtype(np.int32): "s32",
        np.dtype(np.bool_): "pred",
        np.dtype(np.uint32): "u32",
        np.dtype(np.complex64): "c64",
    }
    args = tuple(t.make("param", (k,), (), v.shape, dtypes[v.dtype]) for k, v in enumerate(values))
    return t.make(op, attrs, args, tuple(shape), dtype), dict(enumerate(values))


def _same(term, params, want, exact: bool = False) -> None:
    got = evaluate(term, params)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if exact or want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


UNARY = {
    "negate": (lax.neg, X),
    "abs": (lax.abs, X),
    "exponential": (lax.exp, X),
    "exponential-minus-one": (lax.expm1, X),
    "log": (lax.log, POSITIVE),
    "log-plus-one": (lax.log1p, POSITIVE),
    "logistic": (lax.logistic, X),
    "sqrt": (lax.sqrt, POSITIVE),
    "rsqrt": (lax.rsqrt, POSITIVE),
    "cbrt": (lax.cbrt, X),
    "tanh": (lax.tanh, X),
    "sine": (lax.sin, X),
    "cosine": (lax.cos, X),
    "tan": (lax.tan, X / 4),
    "sign": (lax.sign, X),
    "floor": (lax.floor, X),
    "ceil": (lax.ceil, X),
    "round-nearest-even": (lambda v: lax.round(v, lax.RoundingMethod.TO_NEAREST_EVEN), X),
    "round-nearest-afz": (lambda v: lax.round(v, lax.RoundingMethod.AWAY_FROM_ZERO), X),
    "is-finite": (lax.is_finite, np.where(BOOLS, X, np.float32(np.inf))),
    "erf": (lax.erf, X / 2),
    "exp": (lax.exp, X),  # (the names some HLO printers use)
    "cos": (lax.cos, X),
    "not": (lax.bitwise_not, INTS),
    "real": (lax.real, COMPLEX),
    "imag": (lax.imag, COMPLEX),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_a_unary_term_computes_the_xla_op(name):
    fn, x = UNARY[name]
    want = np.asarray(fn(x))
    term, params = _term(TermTable(), "unary", (name,), [x], x.shape, "pred" if want.dtype == np.bool_ else "f32")
    _same(term, params, want)


def test_not_of_a_predicate_and_the_conversions():
    t = TermTable()
    term, params = _term(t, "unary", ("not",), [BOOLS], BOOLS.shape, "pred")
    _same(term, params, lax.bitwise_not(BOOLS))
    term, params = _term(t, "unary", ("convert",), [X], X.shape, "s32")
    _same(term, params, lax.convert_element_type(X, jnp.int32))
    term, params = _term(t, "unary", ("bitcast-convert",), [X], X.shape, "s32")
    _same(term, params, lax.bitcast_convert_type(X, jnp.int32))


BINARY = {
    "add": (lax.add, X, X.T.reshape(3, 4)),
    "subtract": (lax.sub, X, X.T.reshape(3, 4)),
    "multiply": (lax.mul, X, X.T.reshape(3, 4)),
    "divide": (lax.div, X, POSITIVE),
    "maximum": (lax.max, X, X.T.reshape(3, 4)),
    "minimum": (lax.min, X, X.T.reshape(3, 4)),
    "power": (lax.pow, POSITIVE, X / 2),
    "remainder": (lax.rem, X, POSITIVE),
    "atan2": (lax.atan2, X, X.T.reshape(3, 4)),
    "and": (lax.bitwise_and, INTS, INTS.T.reshape(3, 4)),
    "or": (lax.bitwise_or, INTS, INTS.T.reshape(3, 4)),
    "xor": (lax.bitwise_xor, INTS, INTS.T.reshape(3, 4)),
    "complex": (lax.complex, X, X.T.reshape(3, 4)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_a_binary_term_computes_the_xla_op(name):
    fn, a, b = BINARY[name]
    want = np.asarray(fn(a, b))
    term, params = _term(TermTable(), "binary", (name,), [a, b], a.shape, "s32" if a.dtype == np.int32 else "f32")
    _same(term, params, want)


@pytest.mark.parametrize("name", ["and", "or", "xor"])
def test_a_logical_term_on_predicates(name):
    fn = {"and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor}[name]
    other = BOOLS.T.reshape(3, 4)
    term, params = _term(TermTable(), "binary", (name,), [BOOLS, other], BOOLS.shape, "pred")
    _same(term, params, fn(BOOLS, other))


@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_a_comparison_term_computes_the_xla_compare(direction):
    a, b = INTS, np.where(BOOLS, INTS, INTS.T.reshape(3, 4))  # equal where BOOLS: EQ, LE, GE are tested there
    fn = {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt, "GE": lax.ge}[direction]
    term, params = _term(TermTable(), "binary", (compare_text(direction, "s32"),), [a, b], a.shape, "pred")
    _same(term, params, fn(a, b))


def test_select_and_clamp():
    t = TermTable()
    other = X.T.reshape(3, 4)
    term, params = _term(t, "ternary", ("select",), [BOOLS, X, other], X.shape, "f32")
    _same(term, params, lax.select(BOOLS, X, other))
    lo, hi = np.full_like(X, -1.0), np.full_like(X, 2.0)
    term, params = _term(t, "ternary", ("clamp",), [lo, X, hi], X.shape, "f32")
    _same(term, params, lax.clamp(lo, X, hi))


DOTS = {  # (lhs shape, rhs shape, ((lhs contract, rhs contract), (lhs batch, rhs batch)))
    "matmul": ((3, 4), (4, 5), (((1,), (0,)), ((), ()))),
    "batched": ((2, 3, 4), (2, 4, 5), (((2,), (1,)), ((0,), (0,)))),
    "two contracted, reordered": ((2, 3, 4), (5, 4, 3), (((1, 2), (2, 1)), ((), ()))),
    "batch not leading": ((3, 2, 4), (4, 5, 2), (((2,), (0,)), ((1,), (2,)))),
}


@pytest.mark.parametrize("case", sorted(DOTS))
def test_a_dot_term_computes_dot_general(case):
    lshape, rshape, dims = DOTS[case]
    (lc, rc), (lb, rb) = dims
    lhs, rhs = (RNG.standard_normal(s).astype(np.float32) for s in (lshape, rshape))
    want = np.asarray(lax.dot_general(lhs, rhs, dims, precision=lax.Precision.HIGHEST))
    spec = DotSpec(lb, rb, lc, rc, lhs.ndim, rhs.ndim, ("f32", "f32")).text()
    term, params = _term(TermTable(), "dot", (spec,), [lhs, rhs], want.shape, "f32")
    _same(term, params, want)


@pytest.mark.parametrize("reducer", ["add", "maximum", "minimum", "multiply"])
@pytest.mark.parametrize("dims", [(0,), (1,), (0, 2)])
def test_a_reduce_term_computes_the_xla_reduce(reducer, dims):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    fn = {"add": jnp.sum, "maximum": jnp.max, "minimum": jnp.min, "multiply": jnp.prod}[reducer]
    want = np.asarray(fn(x, axis=dims))
    term, params = _term(TermTable(), "reduce", (reducer, ReduceSpec(3, dims).text()), [x], want.shape, "f32")
    _same(term, params, want)


@pytest.mark.parametrize("reducer", ["and", "or"])
def test_a_logical_reduce(reducer):
    want = np.asarray(jnp.all(BOOLS, axis=1) if reducer == "and" else jnp.any(BOOLS, axis=1))
    term, params = _term(TermTable(), "reduce", (reducer, ReduceSpec(2, (1,)).text()), [BOOLS], want.shape, "pred")
    _same(term, params, want)


@pytest.mark.parametrize(
    ("shape", "out", "dims"), [((3, 4), (4, 2, 3), (2, 0)), ((3,), (3, 5), (0,)), ((), (2, 2), ())]
)
def test_a_bcast_term_computes_broadcast_in_dim(shape, out, dims):
    x = RNG.standard_normal(shape).astype(np.float32)
    term, params = _term(TermTable(), "bcast", (bcast_spec(len(shape), out, dims),), [x], out, "f32")
    _same(term, params, lax.broadcast_in_dim(x, out, dims), exact=True)


@pytest.mark.parametrize(
    ("shape", "out"), [((6, 4), (2, 3, 4)), ((2, 3, 4), (6, 4)), ((4, 3), (4, 1, 3)), ((4, 6), (4, 2, 3))]
)
def test_a_reshape_and_a_transpose_term(shape, out):
    x = RNG.standard_normal(shape).astype(np.float32)
    t = TermTable()
    term, params = _term(t, "reshape", (reshape_spec(shape, out),), [x], out, "f32")
    _same(term, params, lax.reshape(x, out), exact=True)
    perm = tuple(reversed(range(len(shape))))
    term, params = _term(t, "transpose", (",".join(map(str, perm)),), [x], x.transpose(perm).shape, "f32")
    _same(term, params, lax.transpose(x, perm), exact=True)


def test_iota_slice_and_concat():
    t = TermTable()
    _same(t.make("iota", (1,), (), (2, 3), "s32"), {}, lax.broadcasted_iota(jnp.int32, (2, 3), 1))
    term, params = _term(t, "slice", (1, 1, 3), [X], (3, 2), "f32")
    _same(term, params, lax.slice_in_dim(X, 1, 3, axis=1), exact=True)
    other = X[:, :2]
    term, params = _term(t, "concat", (1,), [X, other], (3, 6), "f32")
    _same(term, params, lax.concatenate([X, other], 1), exact=True)


@pytest.mark.parametrize("start", [-2, 0, 1, 3, 9])
def test_a_dynamic_slice_and_update_clamp_their_start_as_xla_does(start):
    t = TermTable()
    s = np.asarray(start, np.int32)
    zero = np.int32(0)  # (jax's own wrap of negative starts is a select before the HLO op, so it is off here)
    term, params = _term(t, "dslice", (1, 2), [X, s], (3, 2), "f32")
    _same(term, params, lax.dynamic_slice(X, (zero, s), (3, 2), allow_negative_indices=False), exact=True)
    update = np.ones((3, 2), np.float32) * 7
    term, params = _term(t, "dupdate", (1,), [X, update, s], X.shape, "f32")
    _same(term, params, lax.dynamic_update_slice(X, update, (zero, s), allow_negative_indices=False), exact=True)


def _gather_case(batched: bool):
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    if batched:  # per batch row b, rows idx[b, j] of x[b]: operand batching dims
        idx = np.array([[0, 4, 7], [-1, 2, 2]], np.int32)[..., None]  # out of range: clamped
        dims = lax.GatherDimensionNumbers(
            offset_dims=(2,),
            collapsed_slice_dims=(1,),
            start_index_map=(1,),
            operand_batching_dims=(0,),
            start_indices_batching_dims=(0,),
        )
        sizes = (1, 1, 3)
    else:  # windows of 2 rows of every batch, starting at idx[j]
        idx = np.array([[0], [3], [9], [-3]], np.int32)
        dims = lax.GatherDimensionNumbers(offset_dims=(1, 2, 3), collapsed_slice_dims=(), start_index_map=(1,))
        sizes = (2, 2, 3)
    return x, idx, dims, sizes


@pytest.mark.parametrize("batched", [False, True])
def test_a_gather_term_computes_the_xla_gather_with_clamped_starts(batched):
    x, idx, dims, sizes = _gather_case(batched)
    want = np.asarray(lax.gather(x, idx, dims, sizes, mode=lax.GatherScatterMode.CLIP))
    g = GatherDims(
        dims.offset_dims,
        dims.collapsed_slice_dims,
        dims.start_index_map,
        dims.operand_batching_dims,
        dims.start_indices_batching_dims,
        idx.ndim - 1,
        sizes,
    )
    term, params = _term(TermTable(), "aligned", (AlignedMap((), (), ()).key(g.key()),), [x, idx], want.shape, "f32")
    _same(term, params, want, exact=True)


@pytest.mark.parametrize("direction", ["LT", "GT"])
@pytest.mark.parametrize("index", [0, 1])
def test_a_sort_term_is_xlas_stable_sort(direction, index):
    keys = RNG.integers(0, 3, (3, 6)).astype(np.int32)  # ties: stability decides the payload's order
    payload = lax.broadcasted_iota(jnp.int32, keys.shape, 1)
    order = jnp.argsort(keys, axis=1, stable=True, descending=direction == "GT")
    want = np.asarray(jnp.take_along_axis(keys if index == 0 else payload, order, axis=1))
    key = AlignedMap(((0, 0),), ((0, 0),), ()).key(f"sort:{direction}:1:{index}")
    term, params = _term(TermTable(), "aligned", (key,), [keys, np.asarray(payload)], keys.shape, "s32")
    _same(term, params, want)


def test_a_scatter_add_term_drops_rows_outside_the_dim():
    """scatter-add of one value per row at that row's index along the fixed dim (as
    translate/scatter_adds.py builds its one-hot): jnp's .at[].add with out-of-range rows dropped."""
    idx = np.array([[0, 3, 3], [5, -1, 1]], np.int32)
    one = np.asarray(2.0, np.float32)
    key = AlignedMap((), ((0, 0), (1, 1)), ((2, 4),)).key("scatter-add")
    term, params = _term(TermTable(), "aligned", (key,), [one, idx], (2, 3, 4), "f32")
    rows, cols = np.indices(idx.shape)
    where = np.stack([rows, cols, idx], axis=-1)
    dims = lax.ScatterDimensionNumbers(
        update_window_dims=(), inserted_window_dims=(0, 1, 2), scatter_dims_to_operand_dims=(0, 1, 2)
    )
    want = lax.scatter_add(
        jnp.zeros((2, 3, 4), jnp.float32),
        where,
        jnp.full(idx.shape, 2.0, jnp.float32),
        dims,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
    )
    _same(term, params, want)


@pytest.mark.parametrize(("name", "fn"), [("divide", lax.div), ("remainder", lax.rem)])
def test_integer_divide_and_remainder_truncate_toward_zero(name, fn):
    divisor = np.where(INTS.T.reshape(3, 4) % 7 == 0, 3, INTS.T.reshape(3, 4) % 7).astype(np.int32) - 3
    divisor[divisor == 0] = -2  # both signs, never zero
    term, params = _term(TermTable(), "binary", (name,), [INTS, divisor], INTS.shape, "s32")
    _same(term, params, fn(INTS, divisor))


@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_integer_divide_and_remainder_by_zero_and_unsigned_are_xlas(dtype):
    """HLO's integer divide truncates toward zero and x / 0, x % 0 have XLA's values on CPU; numpy's
    own `divide` would give floats and `//` would floor. Checked against XLA itself on mixed signs."""
    a = np.array([7, -7, 7, -7, 5, 0, 9], dtype=np.int64).astype(dtype)
    b = np.array([2, 2, -2, -2, 0, 3, 9], dtype=np.int64).astype(dtype)
    for name, xla in (("divide", lax.div), ("remainder", lax.rem)):
        ours = MODELLED_BINARY[name](a, b)
        assert ours.dtype == dtype
        assert ours.tolist() == np.asarray(xla(a, b)).tolist(), name


def test_every_modelled_op_is_checked_against_xla_here():
    assert set(UNARY) == set(MODELLED_UNARY) and set(BINARY) == set(MODELLED_BINARY)


def _lax_gather(x, idx, g: GatherDims):
    dims = lax.GatherDimensionNumbers(
        offset_dims=g.offset,
        collapsed_slice_dims=g.collapsed,
        start_index_map=g.start_map,
        operand_batching_dims=g.operand_batch,
        start_indices_batching_dims=g.indices_batch,
    )
    index = idx[..., None] if g.vector_dim == idx.ndim else idx
    return np.asarray(lax.gather(x, index, dims, g.slice_sizes, mode=lax.GatherScatterMode.CLIP))


@pytest.mark.parametrize("unit_dim", [0, 1])
def test_a_unit_window_dim_batched_gathers_the_same_elements(unit_dim):
    """take_along_axis on one row of a batch, as XLA writes it (the row a window dim), and the
    batched form `unit_windows_batched` gives it: the same elements in the same layout."""
    rng = np.random.default_rng(unit_dim)
    shape = [3, 5, 7]
    shape[unit_dim] = 1
    x = rng.normal(size=shape).astype(np.float32)
    other = 1 - unit_dim
    idx = rng.integers(-2, 9, size=(shape[other],)).astype(np.int32)  # some outside [0, 7): clamped alike
    g = GatherDims((unit_dim,), (2,), (2,), (other,), (0,), 1, (1, 1, 1))
    batched, idx_shape = g.unit_windows_batched(tuple(shape), idx.shape, 2)
    assert batched.offset == () and batched.operand_batch == (0, 1) and idx_shape == tuple(1 if d == unit_dim else shape[other] for d in range(2))
    want = _lax_gather(x, idx, g)
    got = _lax_gather(x, idx.reshape(idx_shape), batched)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_a_window_dim_longer_than_one_or_read_by_an_index_stays_a_window():
    g = GatherDims((0,), (2,), (2,), (1,), (0,), 1, (2, 1, 1))
    assert g.unit_windows_batched((2, 5, 7), (5,), 2) == (g, (5,))
    read = GatherDims((0, 2), (), (0,), (1,), (0,), 1, (1, 1, 7))  # the size-1 dim 0 at a clamped start
    assert read.unit_windows_batched((1, 5, 7), (5,), 3) == (read, (5,))
