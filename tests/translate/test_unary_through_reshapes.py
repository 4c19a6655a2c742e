"""An elementwise op commutes with a reshape: reshape(op(reshape(y))) is op of one reshape of y
(equivci.translate.builder.Builder.reshape_term), so a log taken on keepdims sums and squeezed
again (jax.nn.log_softmax) is the log of the sums that a program without keepdims takes.

Checked numerically on the terms the builder makes, and on JAX programs in a style unlike the blind
vocab-parallel cross-entropy: vocab-sharded log-probabilities as the output (no gather, no loss),
and a near miss that normalizes by the local sum (the psum left out) is a mismatch.
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


def test_a_reshape_undone_around_a_log_leaves_the_log() -> None:
    ev = Evaluator(None, TermTable(), 1)
    sums = ev.table.make("param", (0,), (), (4, 16), "f32")
    kept = ev.reshape_term(sums, Shape("f32", (4, 16, 1)))
    logged = ev.mk("unary", ("log",), [kept], Shape("f32", (4, 16, 1)))
    term = ev.reshape_term(logged, Shape("f32", (4, 16)))
    assert term.op == "unary" and term.args[0] is sums
    value = np.random.default_rng(0).uniform(0.5, 2.0, (4, 16))
    np.testing.assert_allclose(evaluate(term, {0: value}), np.log(value.reshape(4, 16, 1)).reshape(4, 16))


def test_a_reshape_to_another_shape_keeps_the_reshape_under_the_op() -> None:
    ev = Evaluator(None, TermTable(), 1)
    y = ev.table.make("param", (0,), (), (4, 6), "f32")
    logged = ev.mk("unary", ("exponential",), [ev.reshape_term(y, Shape("f32", (24,)))], Shape("f32", (24,)))
    term = ev.reshape_term(logged, Shape("f32", (2, 12)))
    assert term.op == "unary" and term.args[0].op == "reshape" and term.args[0].args[0] is y
    value = np.random.default_rng(1).standard_normal((4, 6))
    np.testing.assert_allclose(evaluate(term, {0: value}), np.exp(value.reshape(24)).reshape(2, 12))


def test_an_op_on_keepdims_values_is_the_op_on_the_values_kept() -> None:
    """max(reshape(a), reshape(b)) (keepdims maxima) is reshape(max(a, b)), a splat reshaped with
    them; an op on index values, with a constant of several values, or on reshapes from two shapes
    keeps its written form."""
    ev = Evaluator(None, TermTable(), 1)
    a, b = (ev.table.make("param", (k,), (), (4, 16), "f32") for k in (0, 1))
    kept = Shape("f32", (4, 16, 1))
    ka, kb = ev.reshape_term(a, kept), ev.reshape_term(b, kept)
    term = binary_terms(ev, "maximum", [ka, kb], kept)
    assert term.op == "reshape" and term.args[0].op == "binary" and term.args[0].args == (a, b)
    shifted = binary_terms(ev, "subtract", [ka, ev.const(np.full((4, 16, 1), 3.0, np.float32), "f32")], kept)
    assert shifted.op == "reshape"
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((4, 16)), rng.standard_normal((4, 16))
    np.testing.assert_allclose(evaluate(term, {0: x, 1: y}), np.maximum(x, y).reshape(4, 16, 1))
    np.testing.assert_allclose(evaluate(shifted, {0: x}), (x - 3.0).reshape(4, 16, 1))
    ramp = ev.const(np.arange(64, dtype=np.float32).reshape(4, 16, 1), "f32")
    assert binary_terms(ev, "add", [ka, ramp], kept).op == "binary"  # not one value: not a splat
    i = ev.table.make("param", (2,), (), (4, 16), "s32")
    ki = ev.reshape_term(i, Shape("s32", (4, 16, 1)))
    assert binary_terms(ev, "add", [ki, ki], Shape("s32", (4, 16, 1))).op == "binary"
    c = ev.table.make("param", (3,), (), (64,), "f32")
    other = ev.reshape_term(c, kept)
    assert binary_terms(ev, "add", [ka, other], kept).op == "binary"


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, D, V = 8, 16, 32


    def logp_inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((T, D), f32), jax.ShapeDtypeStruct((D, V), f32))


    def logp(h, w):
        return jax.nn.log_softmax(h @ w, axis=-1)


    def _logp_vp(h, w, mesh, total):
        def body(h, w):
            z = h @ w
            shifted = z - lax.pmax(z.max(-1), "tp")[:, None]
            return shifted - jnp.log(total(jnp.exp(shifted).sum(-1)))[:, None]

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(None, "tp"))(h, w)


    def logp_vp(h, w, *, mesh):
        return _logp_vp(h, w, mesh, lambda s: lax.psum(s, "tp"))


    def logp_vp_local_sum(h, w, *, mesh):
        return _logp_vp(h, w, mesh, lambda s: s)  # MARK:local
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: logp-vp, reference: m.py:logp, distributed: m.py:logp_vp, inputs: m.py:logp_inputs, mesh: {tp: 4}}
      - {name: logp-vp-local-sum, reference: m.py:logp, distributed: m.py:logp_vp_local_sum,
         inputs: m.py:logp_inputs, mesh: {tp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("logp"), "m.py", MODELS, MANIFEST)


def test_vocab_sharded_log_probabilities_verify(manifest) -> None:
    result = _verify(manifest, "logp-vp")
    assert result.status is Status.VERIFIED, result.findings


def test_log_probabilities_normalized_by_the_local_sum_are_a_mismatch(manifest) -> None:
    result = _verify(manifest, "logp-vp-local-sum")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
