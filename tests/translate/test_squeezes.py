"""An elementwise op on squeezed operands is the squeeze of the op (equivci.translate.squeezes).

The fact is checked numerically on the terms the evaluator builds (the unsqueezed term, squeezed,
against the op as written, on random arrays), its limits on near misses (index arithmetic and
squeezes of different shapes are not lifted), and on JAX programs in a style unlike the blind pipelines: a data-parallel forward that
runs each device's rows one at a time through a fori_loop into an output buffer, against the
reference's batched layer (and a near miss that writes each row one slot late).
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Instruction, Shape
from equivci.layers.segments import program_order
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate import elementwise
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot
from equivci.translate.shapes import broadcast_term

RNG = np.random.default_rng(0)


def _inst(opcode: str, dims: tuple[int, ...], dtype: str = "f32") -> Instruction:
    return Instruction("e", opcode, Shape(dtype, dims), ("a", "b", "c")[: 3 if opcode == "select" else 2], {})


def _row(ev: Evaluator, number: int, shape: tuple[int, ...], row: int, dtype: str = "f32"):
    """reshape(x[row:row+1]) of a parameter x: one row, squeezed."""
    x = ev.table.make("param", (number,), (), shape, dtype)
    window = ev.slice_term(x, 0, row, row + 1)
    return x, ev.reshape_term(window, Shape(dtype, shape[1:]))


def test_a_row_plus_a_broadcast_bias_is_the_squeezed_sum() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x, row = _row(ev, 0, (4, 2, 8), 2)
    b = ev.table.make("param", (1,), (), (8,), "f32")
    bias = broadcast_term(ev, b, Shape("f32", (2, 8)), (1,))
    added = elementwise.binary(ev, _inst("add", (2, 8)), [row, bias], 0)
    term = elementwise.unary(ev, _inst("tanh", (2, 8)), [added], 0)
    assert term.op == "unary" and term.args == (added,)  # the op keeps its form (localization reads it)
    full = ev.unsqueezed[term]
    assert full.op == "unary" and full.shape == (1, 2, 8)
    assert [term, ev.reshape_term(full, Shape("f32", (2, 8)))] in ev.equal_terms  # stated for the proof
    values = {0: RNG.standard_normal((4, 2, 8)).astype(np.float32), 1: RNG.standard_normal(8).astype(np.float32)}
    np.testing.assert_allclose(evaluate(full, values)[0], np.tanh(values[0][2] + values[1]), rtol=1e-6)


def test_a_dot_of_a_scaled_op_on_a_row_is_the_scaled_squeeze_of_the_dot() -> None:
    # 0.5 * tanh(x[2]) @ w: the builder keeps the 0.5 in front of the unsqueezed op too; the dot is
    # still the squeeze of the dot of the whole [1, 2, 8] op, the factor in front of it
    ev = Evaluator(None, TermTable(), 1)
    x, row = _row(ev, 0, (4, 2, 8), 2)
    w = ev.table.make("param", (1,), (), (8, 5), "f32")
    half = ev.const(np.full((2, 8), 0.5, np.float32), "f32")
    gelu_like = elementwise.binary(
        ev, _inst("multiply", (2, 8)), [elementwise.unary(ev, _inst("tanh", (2, 8)), [row], 0), half], 0
    )
    assert ev.scale_of(gelu_like)[0] == 0.5  # in front of the row's op
    inst = Instruction(
        "d", "dot", Shape("f32", (2, 5)), ("a", "b"), {"lhs_contracting_dims": "{1}", "rhs_contracting_dims": "{0}"}
    )
    term = dot(ev, inst, [gelu_like, w], 0)
    factor, base = ev.scale_of(term)
    assert factor == 0.5 and base.op == "reshape" and base.args[0].op == "dot" and base.args[0].shape == (1, 2, 5)
    values = {0: RNG.standard_normal((4, 2, 8)).astype(np.float32), 1: RNG.standard_normal((8, 5)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(term, values), 0.5 * np.tanh(values[0][2]) @ values[1], rtol=1e-5, atol=1e-6)


def test_squeezes_of_one_shape_a_constant_and_a_select_lift_together() -> None:
    ev = Evaluator(None, TermTable(), 1)
    _, a = _row(ev, 0, (3, 5), 1)
    _, b = _row(ev, 1, (3, 5), 0)
    half = ev.const(np.full((5,), 0.5, np.float32), "f32")
    table = ev.const(np.arange(5, dtype=np.float32), "f32")
    scaled = elementwise.binary(ev, _inst("multiply", (5,)), [a, half], 0)
    shifted = elementwise.binary(ev, _inst("subtract", (5,)), [b, table], 0)
    _, p = _row(ev, 2, (3, 5), 2, "pred")
    term = elementwise.select(ev, _inst("select", (5,)), [p, scaled, shifted], 0)
    full = ev.unsqueezed[term]
    assert full.shape == (1, 5)
    # the lifted constants keep their dtype (a term without one cannot be loaded into a proof)
    assert {t.dtype for t in program_order([full])} == {"f32", "pred"}
    values = {
        0: RNG.standard_normal((3, 5)).astype(np.float32),
        1: RNG.standard_normal((3, 5)).astype(np.float32),
        2: RNG.standard_normal((3, 5)) > 0,
    }
    expected = np.where(values[2][2], values[0][1] * 0.5, values[1][0] - np.arange(5))
    np.testing.assert_allclose(evaluate(full, values, ev.values)[0], expected, rtol=1e-6)


def test_integer_arithmetic_on_a_row_is_not_lifted() -> None:
    # index arithmetic (ids + a shard's offset) stays as the mask facts read it
    ev = Evaluator(None, TermTable(), 1)
    _, ids = _row(ev, 0, (2, 6), 1, "s32")
    offset = ev.const(np.full((6,), 3, np.int32), "s32")
    term = elementwise.binary(ev, _inst("add", (6,), "s32"), [ids, offset], 0)
    assert term not in ev.unsqueezed


def test_squeezes_of_different_shapes_are_not_lifted() -> None:
    # [1, 2, 8] and [2, 1, 8] both squeeze to [2, 8]: no one unsqueezed shape holds both
    ev = Evaluator(None, TermTable(), 1)
    _, first = _row(ev, 0, (3, 2, 8), 0)
    y = ev.table.make("param", (1,), (), (2, 3, 8), "f32")
    second = ev.reshape_term(ev.slice_term(y, 1, 1, 2), Shape("f32", (2, 8)))
    term = elementwise.binary(ev, _inst("add", (2, 8)), [first, second], 0)
    assert term not in ev.unsqueezed


def test_an_operand_that_is_neither_squeezed_broadcast_nor_constant_is_not_lifted() -> None:
    ev = Evaluator(None, TermTable(), 1)
    _, row = _row(ev, 0, (3, 4), 1)
    other = ev.table.make("param", (1,), (), (4,), "f32")
    term = elementwise.binary(ev, _inst("add", (4,)), [row, other], 0)
    assert term not in ev.unsqueezed


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    N, T, D = 8, 3, 16


    def inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((N, T, D), f32), jax.ShapeDtypeStruct((D, D), f32),
                jax.ShapeDtypeStruct((D,), f32), jax.ShapeDtypeStruct((D,), f32))


    def layer(x, w, b, g):
        return jax.nn.gelu(jnp.einsum("ntd,de->nte", x, w) + b) * g + x


    def _rows(x, w, b, g, mesh, slot):
        def body(x, w, b, g):
            n = x.shape[0]

            def one(i, out):
                return out.at[slot(i, n)].set(jax.nn.gelu(x[i] @ w + b) * g + x[i])  # MARK:row

            return lax.fori_loop(0, n, one, jnp.zeros_like(x))

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P(), P(), P()), out_specs=P("dp"))(x, w, b, g)


    def rows_dp(x, w, b, g, *, mesh):
        return _rows(x, w, b, g, mesh, lambda i, n: i)


    def rows_dp_late(x, w, b, g, *, mesh):
        return _rows(x, w, b, g, mesh, lambda i, n: (i + 1) % n)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: rows, reference: m.py:layer, distributed: m.py:rows_dp, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: rows-late, reference: m.py:layer, distributed: m.py:rows_dp_late, inputs: m.py:inputs, mesh: {dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("squeezes"), "m.py", MODELS, MANIFEST)


def test_rows_run_one_at_a_time_verify(manifest) -> None:
    result = _verify(manifest, "rows")
    assert result.status is Status.VERIFIED, result.findings


def test_rows_written_one_slot_late_are_a_mismatch(manifest) -> None:
    result = _verify(manifest, "rows-late")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
