"""An elementwise op on a scaled keepdims value is the op on the scaled value, reshaped
(equivci.translate.elementwise.unit_reshaped: a factor in front of the reshape moves inside it): the builder keeps a
constant factor in front of a reshape, so a keepdims mean `sum(x, keepdims=True) / n` is
`(1/n) * reshape(sum(x))`, and `var + eps` on it is reshape((1/n) * sum + eps), the very term of
`(var + eps)[..., None]` taken without keepdims. Exact: a factor is the same at every element and
the reshape only adds or drops size-1 dims.

Checked on the terms the builder makes against XLA's values, and on models: a LayerNorm whose
statistics are kept [B, S, 1] (jnp.var(keepdims=True)) against a reference that takes them [B, S]
and adds the unit dim at the end verifies, an RMSNorm in the same two styles too; the statistics
over the sequence are a mismatch.
"""

from __future__ import annotations

import textwrap
from fractions import Fraction

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.elementwise import binary_terms
from equivci.translate.evaluator import Evaluator

X = np.random.default_rng(7).standard_normal((2, 8, 16)).astype(np.float32)


def test_an_op_on_a_scaled_keepdims_value_is_the_op_on_the_scaled_value_reshaped() -> None:
    ev = Evaluator(None, TermTable(), 1)
    sums = ev.table.make("param", (0,), (), (4, 8), "f32")
    kept = Shape("f32", (4, 8, 1))
    mean = ev.scaled(ev.reshape_term(sums, kept), Fraction(1, 32))
    assert mean is not None and mean.op == "binary" and mean.args[0].op == "reshape"  # the factor in front
    eps = ev.const(np.full((4, 8, 1), 1e-6, np.float32), "f32")
    term = binary_terms(ev, "add", [mean, eps], kept)
    assert term.op == "reshape" and term.args[0].op == "binary" and term.args[0].attrs == ("add",)
    value = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    want = (value.reshape(4, 8, 1) * np.float32(1 / 32)) + np.float32(1e-6)
    np.testing.assert_allclose(evaluate(term, {0: value}, ev.values), want, rtol=1e-7)


def _built(fn, table: TermTable):
    module = parse_module(jax.jit(fn).lower(X).as_text(dialect="hlo"))
    ev = Evaluator(module, table, 1)
    (out,) = ev.run(module.entry, [[ev.table.make("param", (0,), (), X.shape, "f32")]])
    return ev, out


KEPT = {
    "variance": (lambda x: jnp.var(x, -1, keepdims=True) + 1e-6, lambda x: (jnp.var(x, -1) + 1e-6)[..., None]),
    "mean square": (
        lambda x: jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5,
        lambda x: (jnp.mean(jnp.square(x), -1) + 1e-5)[:, :, None],
    ),
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_statistics_kept_or_reshaped_at_the_end_are_one_term(case) -> None:
    kept, reshaped = KEPT[case]
    table = TermTable()
    ev, a = _built(kept, table)
    _, b = _built(reshaped, table)
    assert a is b
    np.testing.assert_allclose(evaluate(a, {0: X}, ev.values), np.asarray(jax.jit(kept)(X)), rtol=1e-6)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D = 4, 8, 32


    def norm_inputs():
        return (jax.ShapeDtypeStruct((B, S, D), jnp.float32),)


    def layer_norm(x):
        mu = x.mean(-1)
        var = jnp.square(x - mu[..., None]).mean(-1)
        return (x - mu[..., None]) * lax.rsqrt(var + 1e-6)[..., None]


    def _dp(norm, x, mesh):
        return jax.shard_map(norm, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))(x)


    def layer_norm_dp(x, mesh):
        return _dp(lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(x, -1, keepdims=True) + 1e-6), x, mesh)


    def layer_norm_dp_over_seq(x, mesh):
        return _dp(lambda x: (x - x.mean(1, keepdims=True)) / jnp.sqrt(jnp.var(x, 1, keepdims=True) + 1e-6), x, mesh)


    def rms_norm(x):
        return x * lax.rsqrt(jnp.mean(jnp.square(x), -1) + 1e-5)[..., None]


    def rms_norm_dp(x, mesh):
        return _dp(lambda x: x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5), x, mesh)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: ln-dp, reference: m.py:layer_norm, distributed: m.py:layer_norm_dp, inputs: m.py:norm_inputs,
         mesh: {dp: 2}}
      - {name: ln-dp-over-seq, reference: m.py:layer_norm, distributed: m.py:layer_norm_dp_over_seq,
         inputs: m.py:norm_inputs, mesh: {dp: 2}}
      - {name: rms-dp, reference: m.py:rms_norm, distributed: m.py:rms_norm_dp, inputs: m.py:norm_inputs,
         mesh: {dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("keepdims"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["ln-dp", "rms-dp"])
def test_norms_with_statistics_kept_against_reshaped_at_the_end_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_statistics_over_the_sequence_are_a_mismatch(manifest) -> None:
    result = _verify(manifest, "ln-dp-over-seq")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
