"""A bf16 operand scaled by a power of two, dotted with f32 accumulation, is the dot scaled:
dot(2^k * x, y) = 2^k * dot(x, y) (equivci.translate.reductions.power_of_two_out), exact in floats
away from the ends of the exponent range (each product and partial sum is scaled exactly), and a
bf16 scalar literal that is a power of two is that number (literals.power_of_two_literal): numpy
cannot round to bf16, but every float dtype holds a power of two exactly.

Checked bit for bit against XLA, on the translator's terms (only a power of two moves: a factor of
0.3 in bf16 rounds the product and stays as written), and end to end on programs unlike the blind
bf16 attention (which folds 1/sqrt(head_dim) = 1/2 into its bf16 queries): a tensor-parallel bf16
MLP whose device scales its bf16 activations by 1/4 before the column-parallel dot where the
reference scales the f32 dot, and a near miss that scales by 1/2.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Instruction, Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.translate.evaluator import Evaluator
from equivci.translate.literals import power_of_two_literal
from equivci.translate.reductions import dot

RNG = np.random.default_rng(31)
BF16, F32 = jnp.bfloat16, jnp.float32


def test_a_power_of_two_moves_out_of_a_bf16_dot_bit_for_bit() -> None:
    x = RNG.standard_normal((6, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 5)).astype(np.float32)
    dot = lambda a, b: jnp.einsum("nd,df->nf", a, b, preferred_element_type=F32)  # noqa: E731
    scaled_first = jax.jit(lambda x, w: dot(x.astype(BF16) * jnp.asarray(0.25, BF16), w.astype(BF16)))(x, w)
    scaled_after = jax.jit(lambda x, w: dot(x.astype(BF16), w.astype(BF16)) * 0.25)(x, w)
    np.testing.assert_array_equal(np.asarray(scaled_first), np.asarray(scaled_after))


@pytest.mark.parametrize("factor, moved", [(0.25, True), (-2.0, True), (3.0, False), (0.75, False)])
def test_only_a_power_of_two_is_moved_in_front_of_the_dot(factor, moved) -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (6, 8), "bf16")
    w = ev.table.make("param", (1,), (), (8, 5), "bf16")
    c = ev.const(np.full((6, 8), factor, np.float32), "bf16")  # a bf16 splat (held in f32)
    a = ev.mk("binary", ("multiply",), [x, c], Shape("bf16", (6, 8)))
    attrs = {"lhs_contracting_dims": "{1}", "rhs_contracting_dims": "{0}"}
    out = dot(ev, Instruction("d", "dot", Shape("f32", (6, 5)), ("a", "w"), attrs), [a, w], 0)
    front, base = ev.scale_of(out)
    if moved:
        assert front == factor and base.op == "dot" and base.args == (x, w)
    else:  # 3 * x rounds in bf16 (x = 1 + 2^-7: 3 + 3 * 2^-7 holds no 8-bit significand)
        assert front == 1 and out.op == "dot" and out.args == (a, w)


@pytest.mark.parametrize(
    "literal, dtype, value", [("0.5", "bf16", 0.5), ("-4", "bf16", -4.0), ("0.1768", "bf16", None), ("0", "bf16", None),
                              ("0.5", "f32", None)]
)
def test_only_a_bf16_power_of_two_literal_is_read_as_its_number(literal, dtype, value) -> None:
    got = power_of_two_literal(literal, Shape(dtype, ()))
    assert (got is None) if value is None else (float(got) == value)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    N, D, F = 8, 16, 32
    BF, F32 = jnp.bfloat16, jnp.float32


    def mlp_inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, F32)
        return f(N, D), f(D, F), f(F, D)


    def mlp(x, w1, w2):
        h = jnp.dot(x.astype(BF), w1.astype(BF), preferred_element_type=F32) * 0.25
        return jnp.dot(jax.nn.gelu(h).astype(BF), w2.astype(BF), preferred_element_type=F32)


    def _mlp_tp(x, w1, w2, mesh, scale):
        def body(x, w1, w2):
            a = x.astype(BF) * jnp.asarray(scale, BF)
            h = jnp.dot(a, w1.astype(BF), preferred_element_type=F32)
            return lax.psum(jnp.dot(jax.nn.gelu(h).astype(BF), w2.astype(BF), preferred_element_type=F32), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp")), out_specs=P())(x, w1, w2)


    def mlp_tp(x, w1, w2, *, mesh):
        return _mlp_tp(x, w1, w2, mesh, 0.25)


    def mlp_tp_half(x, w1, w2, *, mesh):
        return _mlp_tp(x, w1, w2, mesh, 0.5)  # MARK:half
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: bf16-mlp-scaled-input, reference: m.py:mlp, distributed: m.py:mlp_tp, inputs: m.py:mlp_inputs,
         mesh: {tp: 4}}
      - {name: bf16-mlp-scaled-by-half, reference: m.py:mlp, distributed: m.py:mlp_tp_half, inputs: m.py:mlp_inputs,
         mesh: {tp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("pow2_dots"), "m.py", MODELS, MANIFEST)


def test_a_bf16_input_scaled_before_a_column_parallel_dot_verifies(manifest) -> None:
    result = _verify(manifest, "bf16-mlp-scaled-input")
    assert result.status is Status.VERIFIED, result.findings


def test_a_bf16_input_scaled_by_the_wrong_power_of_two_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "bf16-mlp-scaled-by-half")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
