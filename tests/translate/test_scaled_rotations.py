"""The facts of an elementwise op (its signed sum in one form, its pieces when an operand is a
concatenation: equivci.translate.signed_sums, equivci.translate.pieces) are stated for the op under
a constant factor the builder moved in front, x * (c * s) = (x * s) * c, as for the written op.

YaRN scales RoPE's cos and sin by an attention factor: one program multiplies the tables, another
the rotated sum, a third a complex rotation `complex(cos, sin) * c`; the factor ends in front of
each, and the rotations meet only under it. Checked on terms (the op under the factor has its
pieces and its signed form, each evaluating to its value) and on JAX programs: a NeoX reference
with scaled tables against halves on sequence shards with scaled tables, against the factor on the
rotated halves, and against a complex rotation on head shards; near misses (the factor on cos
only, no factor, the factor twice, the sin's sign flipped under the factor) are mismatches.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.elementwise import binary_terms
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(0)
B, S, HD = 2, 3, 8
SCALE = 1.1386294364929199  # YaRN's 0.1 * ln(4) + 1, a number of f32 that is no power of two


def _bin(ev, op, a, b):
    return binary_terms(ev, op, [a, b], Shape(a.dtype, a.shape))


def _stated(ev, term):
    return [other for group in ev.equal_terms if term in group for other in group if other is not term]


def test_the_op_under_a_moved_factor_has_its_pieces_and_its_signed_form() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (B, S, HD), "f32")
    sin = ev.table.make("param", (1,), (), (B, S, HD), "f32")
    values = {0: RNG.standard_normal((B, S, HD)), 1: RNG.standard_normal((B, S, HD))}
    h = HD // 2
    x1, x2 = ev.slice_term(x, 2, 0, h), ev.slice_term(x, 2, h, HD)
    rotated = ev.concat([ev.mk("unary", ("negate",), [x2], Shape("f32", x2.shape)), x1], 2)
    scaled_sin = _bin(ev, "multiply", sin, ev.const(np.full(sin.shape, SCALE, np.float32), "f32"))
    product = _bin(ev, "multiply", rotated, scaled_sin)
    factor, base = ev.scale_of(product)
    assert factor != 1 and base is not product, "the builder moves the factor in front"
    form = ev.piecewise.get(base)
    assert form is not None and form.op == "concat" and form in _stated(ev, base)
    np.testing.assert_allclose(evaluate(form, values), evaluate(base, values), rtol=1e-6)
    # a difference of scaled products: the builder keeps (a * c - b * s) * f, and the difference
    # under the factor has its signed form
    c = ev.table.make("param", (2,), (), (B, S, h), "f32")
    values[2] = RNG.standard_normal((B, S, h))
    f = ev.const(np.full((B, S, h), SCALE, np.float32), "f32")
    s_half = ev.slice_term(sin, 2, 0, h)
    difference = _bin(
        ev, "subtract", _bin(ev, "multiply", x1, _bin(ev, "multiply", c, f)), _bin(ev, "multiply", x2, s_half)
    )
    assert _stated(ev, difference) or ev.scale_of(difference)[0] == 1
    both = _bin(
        ev,
        "subtract",
        _bin(ev, "multiply", x1, _bin(ev, "multiply", c, f)),
        _bin(ev, "multiply", x2, _bin(ev, "multiply", s_half, f)),
    )
    factor, under = ev.scale_of(both)
    assert factor != 1 and under.attrs == ("subtract",)
    stated = _stated(ev, under)
    assert stated, "the difference under the factor has a signed form"
    for other in stated:
        np.testing.assert_allclose(evaluate(other, values), evaluate(under, values), rtol=1e-6)


def test_an_unscaled_op_states_nothing_more() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (B, S, HD), "f32")
    y = ev.table.make("param", (1,), (), (B, S, HD), "f32")
    product = _bin(ev, "multiply", x, y)
    assert ev.scale_of(product)[0] == 1 and product not in ev.piecewise


MODELS = textwrap.dedent(
    """\
    import math

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, H, HD = 2, 8, 4, 8
    SCALE = 0.1 * math.log(4.0) + 1.0


    def inputs():
        return jax.ShapeDtypeStruct((B, S, H, HD), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32)


    def _angles(positions):
        inv = 10000.0 ** (-jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)
        return positions.astype(jnp.float32)[:, None] * inv


    def rotate_half(x):
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([-x2, x1], axis=-1)


    def neox_scaled(x, start):
        ang = _angles(start + jnp.arange(S))
        emb = jnp.concatenate([ang, ang], -1)
        cos, sin = jnp.cos(emb) * SCALE, jnp.sin(emb) * SCALE
        return x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]


    def _positions(rows):
        return lax.axis_index("sp") * rows + jnp.arange(rows)


    def _halves(cos_scale, sin_scale, out_scale, sign=1.0):
        def body(x, start):
            ang = _angles(start + _positions(x.shape[1]))
            cos, sin = jnp.cos(ang) * cos_scale, sign * jnp.sin(ang) * sin_scale
            cos, sin = cos[None, :, None, :], sin[None, :, None, :]
            x1, x2 = jnp.split(x, 2, axis=-1)
            return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1) * out_scale
        return body


    def _seq(body, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sp"), P()), out_specs=P(None, "sp"))


    def tables_sp(x, start, *, mesh):
        return _seq(_halves(SCALE, SCALE, 1.0), mesh)(x, start)


    def rotated_sp(x, start, *, mesh):
        return _seq(_halves(1.0, 1.0, SCALE), mesh)(x, start)


    def cos_only_sp(x, start, *, mesh):
        return _seq(_halves(SCALE, 1.0, 1.0), mesh)(x, start)  # MARK:cos_only


    def unscaled_sp(x, start, *, mesh):
        return _seq(_halves(1.0, 1.0, 1.0), mesh)(x, start)  # MARK:unscaled


    def twice_sp(x, start, *, mesh):
        return _seq(_halves(SCALE, SCALE, SCALE), mesh)(x, start)  # MARK:twice


    def flipped_sp(x, start, *, mesh):
        return _seq(_halves(SCALE, SCALE, 1.0, sign=-1.0), mesh)(x, start)  # MARK:flipped


    def complex_tp(x, start, *, mesh):
        def body(x, start):
            ang = _angles(start + jnp.arange(S))
            rot = lax.complex(jnp.cos(ang), jnp.sin(ang)) * SCALE
            z = lax.complex(x[..., : HD // 2], x[..., HD // 2 :]) * rot[None, :, None, :]
            return jnp.concatenate([jnp.real(z), jnp.imag(z)], axis=-1)

        spec = (P(None, None, "tp"), P())
        return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P(None, None, "tp"))(x, start)
    """
)

_ROWS = [
    ("tables-sp", "tables_sp", "{sp: 2}"),
    ("rotated-sp", "rotated_sp", "{sp: 2}"),
    ("complex-tp", "complex_tp", "{tp: 2}"),
    ("cos-only-sp", "cos_only_sp", "{sp: 2}"),
    ("unscaled-sp", "unscaled_sp", "{sp: 2}"),
    ("twice-sp", "twice_sp", "{sp: 2}"),
    ("flipped-sp", "flipped_sp", "{sp: 2}"),
]
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: m.py:neox_scaled, distributed: m.py:{fn}, inputs: m.py:inputs, mesh: {mesh}}}\n"
    for name, fn, mesh in _ROWS
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("scaled_rotations"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["tables-sp", "rotated-sp", "complex-tp"])
def test_scaled_rotations_written_three_ways_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["cos-only-sp", "unscaled-sp", "twice-sp", "flipped-sp"])
def test_near_misses_of_the_scaled_rotation_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
