"""An elementwise op on a concatenation is the concatenation of the op on the pieces, a negated
factor of a product is a coefficient of the sum it is in (equivci.translate.pieces,
equivci.translate.signed_sums), and a product with a constant matrix whose columns each hold at most
one non-zero is a concatenation of scaled windows (equivci.translate.moved_columns): every way of
writing a rotary embedding's half rotation meets the others there.

Checked on terms (each stated form evaluates to the op's value; a negated factor on either side; a
matrix on either side of the product, and one with two non-zeros in a column left alone), and on JAX
programs in four styles against NeoX's rotate_half reference: by halves on sequence shards, a fused
roll times a signed sin on head shards, rotate_half itself and rotate_half as a matrix on head
shards (and by halves against the matrix as the reference). Near misses (the sign of the sin
flipped, the halves swapped, the roll by one, interleaved pairs taken as the halves, the matrix's
sign flipped) are mismatches.
"""

from __future__ import annotations

import textwrap
from fractions import Fraction

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify
from test_dot_relayouts import _dot_inst

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.elementwise import binary_terms
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot

RNG = np.random.default_rng(0)
B, S, HD = 2, 3, 8


def _setup():
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (B, S, HD), "f32")
    cos = ev.table.make("param", (1,), (), (B, S, HD // 2), "f32")
    sin = ev.table.make("param", (2,), (), (B, S, HD // 2), "f32")
    values = {
        0: RNG.standard_normal((B, S, HD)),
        1: RNG.standard_normal((B, S, HD // 2)),
        2: RNG.standard_normal((B, S, HD // 2)),
    }
    return ev, x, cos, sin, values


def _neg(ev, t):
    return ev.mk("unary", ("negate",), [t], Shape(t.dtype, t.shape))


def _bin(ev, op, a, b):
    return binary_terms(ev, op, [a, b], Shape(a.dtype, a.shape))


def _stated(ev, term):
    return [other for group in ev.equal_terms if term in group for other in group if other is not term]


def test_a_product_with_a_concatenation_is_stated_as_the_concatenation_of_the_pieces() -> None:
    ev, x, cos, sin, values = _setup()
    h = HD // 2
    x1, x2 = ev.slice_term(x, 2, 0, h), ev.slice_term(x, 2, h, HD)
    rotated = ev.concat([_neg(ev, x2), x1], 2)
    product = _bin(ev, "multiply", rotated, ev.concat([sin, sin], 2))
    form = ev.piecewise[product]
    assert form.op == "concat" and form in _stated(ev, product)
    np.testing.assert_allclose(evaluate(form, values), evaluate(product, values), rtol=1e-6)
    # NeoX's rotation: x * [cos, cos] + rotate_half(x) * [sin, sin] is the concatenation of the
    # halves' signed sums, the form the by-halves style writes
    total = _bin(ev, "add", _bin(ev, "multiply", x, ev.concat([cos, cos], 2)), product)
    joined = ev.piecewise[total]
    np.testing.assert_allclose(evaluate(joined, values), evaluate(total, values), rtol=1e-6)
    x1v, x2v, c, s = values[0][..., :h], values[0][..., h:], values[1], values[2]
    expected = np.concatenate([x1v * c - x2v * s, x2v * c + x1v * s], axis=2)
    np.testing.assert_allclose(evaluate(joined, values), expected, rtol=1e-6)


def test_a_broadcast_concatenation_is_cut_where_its_operand_is() -> None:
    # roll(x, h) * concat(-sin, sin) broadcast over a heads dim: each piece reads its own half of sin
    ev, x, _, sin, values = _setup()
    heads = 2
    xh = ev.table.make("param", (3,), (), (B, S, heads, HD), "f32")
    values[3] = RNG.standard_normal((B, S, heads, HD))
    minus = ev.binary("multiply", sin, ev.splat(Fraction(-1), Shape("f32", sin.shape)))
    signed = ev.mk("bcast", ("i0,i1,n2,i2",), [ev.concat([minus, sin], 2)], Shape("f32", (B, S, heads, HD)))
    rolled = ev.concat([ev.slice_term(xh, 3, HD // 2, HD), ev.slice_term(xh, 3, 0, HD // 2)], 3)
    product = _bin(ev, "multiply", rolled, signed)
    form = ev.piecewise[product]
    np.testing.assert_allclose(evaluate(form, values), evaluate(product, values), rtol=1e-6)
    assert form.op == "concat" and form.attrs == (3,)


def test_a_negated_factor_on_either_side_gives_one_signed_form() -> None:
    ev, x, cos, sin, values = _setup()
    a, b = ev.slice_term(x, 2, 0, 4), ev.slice_term(x, 2, 4, 8)
    forms = []
    for product in (_bin(ev, "multiply", _neg(ev, b), sin), _bin(ev, "multiply", b, _neg(ev, sin))):
        total = _bin(ev, "add", _bin(ev, "multiply", a, cos), product)
        stated = _stated(ev, total)
        assert stated, "the sum with a negated factor has a signed form"
        for form in stated:
            np.testing.assert_allclose(evaluate(form, values), evaluate(total, values), rtol=1e-6)
        forms.append(set(stated))
    difference = _bin(ev, "subtract", _bin(ev, "multiply", a, cos), _bin(ev, "multiply", b, sin))
    assert forms[0] & forms[1] & ({difference} | set(_stated(ev, difference)))


def test_a_product_without_a_concatenated_operand_states_no_pieces() -> None:
    ev, x, cos, _, _ = _setup()
    product = _bin(ev, "multiply", ev.slice_term(x, 2, 0, 4), cos)
    assert product not in ev.piecewise


def _rotate_half_matrix(sign: float = 1.0) -> np.ndarray:
    """R with x @ R = concat(-x2, x1): column j < h reads row j + h negated, column j >= h row j - h."""
    h = HD // 2
    matrix = np.zeros((HD, HD), np.float32)
    matrix[h:, :h] = -sign * np.eye(h)
    matrix[:h, h:] = np.eye(h)
    return matrix


@pytest.mark.parametrize("left", [False, True])
def test_a_constant_matrix_that_moves_columns_is_a_concatenation_of_scaled_windows(left: bool) -> None:
    ev, x, _, _, values = _setup()
    matrix = ev.const(_rotate_half_matrix() if not left else _rotate_half_matrix().T, "f32")
    if left:  # R @ x over x's first dim: x laid out [HD, B * S]
        x = ev.table.make("param", (4,), (), (HD, B * S), "f32")
        values[4] = RNG.standard_normal((HD, B * S))
        inst = _dot_inst((HD, B * S), "{1}", "{0}")
        term = dot(ev, inst, [matrix, x], 0)
        expected = _rotate_half_matrix().T @ values[4]
    else:
        term = dot(ev, _dot_inst((B, S, HD), "{2}", "{0}"), [x, matrix], 0)
        expected = values[0] @ _rotate_half_matrix()
    form = ev.piecewise[term]
    np.testing.assert_allclose(evaluate(term, values, ev.values), expected, rtol=1e-6)
    np.testing.assert_allclose(evaluate(form, values, ev.values), expected, rtol=1e-6)
    assert form.op == "concat" and form in _stated(ev, term)


@pytest.mark.parametrize("entry", [(0, 0, 1.0), (5, 0, 0.5)])
def test_a_matrix_with_two_non_zeros_in_a_column_is_no_window(entry) -> None:
    ev, x, _, _, _ = _setup()
    matrix = _rotate_half_matrix()
    matrix[entry[0], entry[1]] += entry[2]
    term = dot(ev, _dot_inst((B, S, HD), "{2}", "{0}"), [x, ev.const(matrix, "f32")], 0)
    assert term not in ev.piecewise


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    B, S, H, HD = 2, 8, 4, 8


    def inputs():
        return jax.ShapeDtypeStruct((B, S, H, HD), jnp.float32), jax.ShapeDtypeStruct((B, S), jnp.int32)


    def _angles(positions):
        inv = 10000.0 ** (-jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)
        ang = positions.astype(jnp.float32)[..., None] * inv
        return jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]


    def rotate_half(x):
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([-x2, x1], axis=-1)


    def neox(x, positions):
        cos, sin = _angles(positions)
        cos, sin = jnp.concatenate([cos, cos], -1), jnp.concatenate([sin, sin], -1)
        return x * cos + rotate_half(x) * sin


    def _halves(first, second):
        def rope(x, positions):
            cos, sin = _angles(positions)
            x1, x2 = first(x), second(x)
            return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return rope


    def _swapped(x, positions):
        cos, sin = _angles(positions)
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([x2 * cos + x1 * sin, x1 * cos - x2 * sin], axis=-1)  # MARK:swapped


    def _rolled(shift, signs):
        def rope(x, positions):
            cos, sin = _angles(positions)
            signed = jnp.concatenate([signs[0] * sin, signs[1] * sin], -1)
            return x * jnp.concatenate([cos, cos], -1) + jnp.roll(x, shift, axis=-1) * signed
        return rope


    def _seq(rope, mesh):
        spec = (P(None, "sp"), P(None, "sp"))
        return lambda x, positions: jax.shard_map(rope, mesh=mesh, in_specs=spec, out_specs=P(None, "sp"))(
            x, positions)


    def _heads(rope, mesh):
        spec = (P(None, None, "tp"), P())
        return lambda x, positions: jax.shard_map(rope, mesh=mesh, in_specs=spec, out_specs=P(None, None, "tp"))(
            x, positions)


    def halves_sp(x, positions, *, mesh):
        return _seq(_halves(lambda x: x[..., : HD // 2], lambda x: x[..., HD // 2 :]), mesh)(x, positions)


    def pairs_as_halves_sp(x, positions, *, mesh):
        return _seq(_halves(lambda x: x[..., ::2], lambda x: x[..., 1::2]), mesh)(x, positions)  # MARK:pairs


    def swapped_sp(x, positions, *, mesh):
        return _seq(_swapped, mesh)(x, positions)


    def roll_tp(x, positions, *, mesh):
        return _heads(_rolled(HD // 2, (-1, 1)), mesh)(x, positions)


    def roll_sign_tp(x, positions, *, mesh):
        return _heads(_rolled(HD // 2, (1, -1)), mesh)(x, positions)  # MARK:sign


    def roll_by_one_tp(x, positions, *, mesh):
        return _heads(_rolled(1, (-1, 1)), mesh)(x, positions)  # MARK:by_one


    def rotate_half_tp(x, positions, *, mesh):
        return _heads(neox, mesh)(x, positions)


    def _matrix(sign):
        h = HD // 2
        r = np.zeros((HD, HD), np.float32)
        r[h:, :h] = -sign * np.eye(h)
        r[:h, h:] = np.eye(h)
        return jnp.asarray(r)


    def _by_matrix(sign):
        def rope(x, positions):
            cos, sin = _angles(positions)
            cos, sin = jnp.concatenate([cos, cos], -1), jnp.concatenate([sin, sin], -1)
            return x * cos + (x @ _matrix(sign)) * sin  # MARK:matrix
        return rope


    neox_matrix = _by_matrix(1.0)


    def matrix_tp(x, positions, *, mesh):
        return _heads(_by_matrix(1.0), mesh)(x, positions)


    def matrix_sign_tp(x, positions, *, mesh):
        return _heads(_by_matrix(-1.0), mesh)(x, positions)
    """
)

_ROWS = [
    ("halves-sp", "halves_sp", "{sp: 2}"),
    ("pairs-as-halves-sp", "pairs_as_halves_sp", "{sp: 2}"),
    ("swapped-sp", "swapped_sp", "{sp: 2}"),
    ("roll-tp", "roll_tp", "{tp: 2}"),
    ("roll-sign-tp", "roll_sign_tp", "{tp: 2}"),
    ("roll-by-one-tp", "roll_by_one_tp", "{tp: 2}"),
    ("rotate-half-tp", "rotate_half_tp", "{tp: 2}"),
    ("matrix-tp", "matrix_tp", "{tp: 2}"),
    ("matrix-sign-tp", "matrix_sign_tp", "{tp: 2}"),
    ("matrix-reference-halves-sp", "halves_sp", "{sp: 2}", "neox_matrix"),
]
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: m.py:{ref[0] if ref else 'neox'}, distributed: m.py:{fn}, inputs: m.py:inputs,"
    f" mesh: {mesh}}}\n"
    for name, fn, mesh, *ref in _ROWS
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("rotation_pieces"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["halves-sp", "roll-tp", "rotate-half-tp", "matrix-tp", "matrix-reference-halves-sp"])
def test_half_rotations_written_four_ways_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize(
    "name", ["pairs-as-halves-sp", "swapped-sp", "roll-sign-tp", "roll-by-one-tp", "matrix-sign-tp"]
)
def test_near_misses_of_the_half_rotation_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
