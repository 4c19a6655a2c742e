"""A quotient by a square root is the product by the reciprocal square root
(equivci.translate.elementwise.reciprocal_root_product): x / sqrt(v) = x * rsqrt(v) and
1 / sqrt(v) = rsqrt(v) over the reals, the root under the same broadcasts and reshapes, so a
LayerNorm written `(x - mu) / jnp.sqrt(jnp.var(x) + eps)` meets one written
`(x - mu) * lax.rsqrt(var + eps)` (split 14's bf16 block). jnp.var lowers to the centered form
`sum(square(x - mean(x))) / n` (its select on `n - ddof > 0` folds), the very terms of a hand-written
`jnp.square(x - mu).mean(-1)`.

Checked on the terms the builder states against XLA's values of the program written with rsqrt,
and on models: LayerNorm over data shards and RMSNorm over sequence shards (the quotient on either
side) verify; the variance over the wrong axis, the epsilon outside the root and a product by the
root (not its reciprocal) are mismatches.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from jax import lax
from model_package import verify_named as _verify

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(5)
X = RNG.standard_normal((2, 8, 16)).astype(np.float32)


def _built(fn, x: np.ndarray, table: TermTable):
    module = parse_module(jax.jit(fn).lower(x).as_text(dialect="hlo"))
    ev = Evaluator(module, table, 1)
    param = ev.table.make("param", (0,), (), x.shape, "f32")
    (out,) = ev.run(module.entry, [[param]])
    return ev, out


def _stated_for(ev: Evaluator, term: Term) -> list[Term]:
    return [t for group in ev.equal_terms if term in group for t in group if t is not term]


def _layer_norm_div(x):
    return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(x, -1, keepdims=True) + 1e-6)


def _layer_norm_rsqrt(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(jnp.square(x - mu).mean(-1, keepdims=True) + 1e-6)


def _layer_norm_reciprocal(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * (1.0 / jnp.sqrt(jnp.square(x - mu).mean(-1, keepdims=True) + 1e-6))


def _rms_div(x):
    return x / jnp.sqrt(jnp.mean(x * x, -1)[..., None] + 1e-6)


def _rms_rsqrt(x):
    return x * lax.rsqrt(jnp.mean(x * x, -1)[..., None] + 1e-6)


WRITTEN = {
    "LayerNorm by jnp.var and a quotient": (_layer_norm_div, _layer_norm_rsqrt),
    "LayerNorm by the reciprocal of the root": (_layer_norm_reciprocal, _layer_norm_rsqrt),
    "RMSNorm without keepdims": (_rms_div, _rms_rsqrt),
}


@pytest.mark.parametrize("case", sorted(WRITTEN))
def test_a_quotient_by_a_root_is_stated_as_the_product_by_the_reciprocal_root(case) -> None:
    by_root, by_rsqrt = WRITTEN[case]
    table = TermTable()
    ev, out = _built(by_root, X, table)
    _, written = _built(by_rsqrt, X, table)
    assert written.op == "binary" and written.attrs == ("multiply",)
    # the output, or the reciprocal it is the product by (then equal by congruence), is stated as
    # the rsqrt form or a part of it
    roots = [t for t in _terms_under([[out]]) if t.op == "binary" and t.attrs == ("divide",)]
    parts = _terms_under([[written]])
    assert any(s in parts and s.op != "param" for t in roots for s in _stated_for(ev, t)), (
        f"nothing stated as {written}"
    )
    for group in ev.equal_terms:  # each statement within a rounding or two
        first, *others = (evaluate(t, {0: X}, ev.values) for t in group)
        for value in others:
            np.testing.assert_allclose(value, first, rtol=2e-6, atol=1e-6)
    expected = np.asarray(jax.jit(by_rsqrt)(X))  # the rsqrt form: XLA's value of the other program
    np.testing.assert_allclose(evaluate(written, {0: X}, ev.values), expected, rtol=2e-6, atol=1e-6)


NOT_ROOTS = {
    "a quotient by an exponential": lambda x: x / jnp.exp(x),
    "a quotient by a root plus one": lambda x: x / (jnp.sqrt(jnp.abs(x)) + 1.0),
    "a product by a root": lambda x: x * jnp.sqrt(jnp.abs(x)),
}


@pytest.mark.parametrize("case", sorted(NOT_ROOTS))
def test_nothing_is_stated_for_other_divisors(case) -> None:
    ev, out = _built(NOT_ROOTS[case], X, TermTable())
    assert not any(t.op == "unary" and t.attrs == ("rsqrt",) for t in _terms_under(ev.equal_terms))


def _terms_under(groups: list[list[Term]]) -> set[Term]:
    seen: set[Term] = set()
    stack = [t for g in groups for t in g]
    while stack:
        t = stack.pop()
        if t not in seen:
            seen.add(t)
            stack.extend(t.args)
    return seen


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D = 4, 8, 32


    def norm_inputs():
        return (jax.ShapeDtypeStruct((B, S, D), jnp.float32), jax.ShapeDtypeStruct((D,), jnp.float32))


    def layer_norm(x, g):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * lax.rsqrt(jnp.square(x - mu).mean(-1, keepdims=True) + 1e-6) * g


    def _dp(norm, x, g, mesh):
        return jax.shard_map(norm, mesh=mesh, in_specs=(P("dp"), P()), out_specs=P("dp"))(x, g)


    def layer_norm_dp(x, g, mesh):
        return _dp(lambda x, g: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(x, -1, keepdims=True) + 1e-6) * g,
                   x, g, mesh)


    def layer_norm_dp_var_over_seq(x, g, mesh):
        return _dp(lambda x, g: (x - x.mean(1, keepdims=True)) / jnp.sqrt(jnp.var(x, 1, keepdims=True) + 1e-6) * g,
                   x, g, mesh)


    def layer_norm_dp_eps_outside(x, g, mesh):
        return _dp(lambda x, g: (x - x.mean(-1, keepdims=True)) / (jnp.sqrt(jnp.var(x, -1, keepdims=True)) + 0.5) * g,
                   x, g, mesh)


    def rms_norm(x, g):
        return x / jnp.sqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-5) * g


    def _sp(norm, x, g, mesh):
        return jax.shard_map(norm, mesh=mesh, in_specs=(P(None, "sp"), P()), out_specs=P(None, "sp"))(x, g)


    def rms_norm_sp(x, g, mesh):
        return _sp(lambda x, g: g * (x * lax.rsqrt(jnp.mean(x * x, axis=2, keepdims=True) + 1e-5)), x, g, mesh)


    def rms_norm_sp_by_root(x, g, mesh):
        return _sp(lambda x, g: g * (x * jnp.sqrt(jnp.mean(x * x, axis=2, keepdims=True) + 1e-5)), x, g, mesh)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: ln-dp, reference: m.py:layer_norm, distributed: m.py:layer_norm_dp, inputs: m.py:norm_inputs,
         mesh: {dp: 2}}
      - {name: ln-dp-var-over-seq, reference: m.py:layer_norm, distributed: m.py:layer_norm_dp_var_over_seq,
         inputs: m.py:norm_inputs, mesh: {dp: 2}}
      - {name: ln-dp-eps-outside, reference: m.py:layer_norm, distributed: m.py:layer_norm_dp_eps_outside,
         inputs: m.py:norm_inputs, mesh: {dp: 2}}
      - {name: rms-sp, reference: m.py:rms_norm, distributed: m.py:rms_norm_sp, inputs: m.py:norm_inputs,
         mesh: {sp: 4}}
      - {name: rms-sp-by-root, reference: m.py:rms_norm, distributed: m.py:rms_norm_sp_by_root,
         inputs: m.py:norm_inputs, mesh: {sp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("roots"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["ln-dp", "rms-sp"])
def test_norms_written_with_a_quotient_or_an_rsqrt_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["ln-dp-var-over-seq", "ln-dp-eps-outside", "rms-sp-by-root"])
def test_near_misses_of_the_root_are_a_mismatch(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
