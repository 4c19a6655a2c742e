"""An exponential of a value less the log of a positive sum is the quotient by that sum
(equivci.translate.log_quotients): exp(u - log s) = exp(u) / s over the reals for s > 0, so softmax
written exp(x - lse) (a vocabulary-parallel device's, with lse = m + log psum(Σ exp(x - m)))
meets `jax.nn.softmax`'s exp(x - m) / Σ exp(x - m).

Checked on the terms the builder states (each statement evaluated on both sides; nothing is
stated where s may be zero or negative: a log of an input, of a difference) and on models in three
styles: an entropy on vocabulary shards, a distillation loss Σ softmax(t) · log_softmax(s) on
vocabulary shards, and the reference written with exp(x - logsumexp) against a device's softmax
quotient. A device that subtracts the log of its own shard's sum is a mismatch.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(11)
X = RNG.standard_normal((4, 16)).astype(np.float32)


def _stated_quotients(fn):
    module = parse_module(jax.jit(fn).lower(X).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    ev.run(module.entry, [[ev.table.make("param", (0,), (), X.shape, "f32")]])
    pairs = [
        (a, b)
        for group in ev.equal_terms
        for a in group
        for b in group
        if a.op == "unary" and a.attrs == ("exponential",) and b.op == "binary" and b.attrs == ("divide",)
    ]
    return ev, pairs


def _softmax_by_lse(x):
    m = jnp.max(x, -1, keepdims=True)
    return jnp.exp(x - (m + jnp.log(jnp.sum(jnp.exp(x - m), -1, keepdims=True))))


def _softmax_by_logsumexp(x):
    return jnp.exp(x - jax.nn.logsumexp(x, -1, keepdims=True))


def _scaled_sum(x):  # a positive factor keeps the sum positive
    return jnp.exp(2.0 * x - jnp.log(0.5 * jnp.sum(jnp.exp(x), -1))[:, None])


@pytest.mark.parametrize("fn", [_softmax_by_lse, _softmax_by_logsumexp, _scaled_sum])
def test_exp_less_the_log_of_a_positive_sum_is_stated_as_the_quotient(fn):
    ev, pairs = _stated_quotients(fn)
    assert pairs
    for a, b in pairs:
        np.testing.assert_allclose(evaluate(a, {0: X}, ev.values), evaluate(b, {0: X}, ev.values), rtol=1e-5)
    np.testing.assert_allclose(evaluate(pairs[0][1], {0: X}, ev.values), np.asarray(jax.jit(fn)(X)), rtol=1e-5)


def _log_of_input(x):  # x may be negative: log x is NaN there, exp(x) / x a number
    return jnp.exp(x - jnp.log(x))


def _log_of_difference(x):
    return jnp.exp(x - jnp.log(jnp.sum(jnp.exp(x), -1) - 1.0)[:, None])


def _log_of_negated_scale(x):
    return jnp.exp(x - jnp.log(-0.5 * jnp.sum(jnp.exp(x), -1))[:, None])


def _log_of_sine(x):  # a unary op other than exp (or abs of a positive value) may be negative
    return jnp.exp(x - jnp.log(jnp.sin(x)))


def _log_added(x):  # exp(x + log s) is exp(x) * s, no quotient
    return jnp.exp(x + jnp.log(jnp.sum(jnp.exp(x), -1))[:, None])


@pytest.mark.parametrize("fn", [_log_of_input, _log_of_difference, _log_of_negated_scale, _log_of_sine, _log_added])
def test_nothing_is_stated_where_the_log_may_not_be_of_a_positive_value(fn):
    assert _stated_quotients(fn)[1] == []


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, V = 6, 32


    def inputs():
        return jax.ShapeDtypeStruct((T, V), jnp.float32), jax.ShapeDtypeStruct((T, V), jnp.float32)


    def _vocab_shards(local, *args, mesh):
        specs = tuple(P(None, "tp") for _ in args)
        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(*args)


    def _lse(x, own=False):
        m = lax.pmax(jnp.max(x, -1), "tp")
        s = jnp.sum(jnp.exp(x - m[:, None]), -1)
        return m + jnp.log(s if own else lax.psum(s, "tp"))


    def entropy(x, t):
        p = jax.nn.softmax(x, -1)
        return jax.nn.logsumexp(x, -1) - jnp.sum(p * x, -1)


    def entropy_tp(x, t, *, mesh):
        def local(x, t):
            lse = _lse(x)
            return lse - lax.psum(jnp.sum(jnp.exp(x - lse[:, None]) * x, -1), "tp")

        return _vocab_shards(local, x, t, mesh=mesh)


    def entropy_own_sum(x, t, *, mesh):
        def local(x, t):
            lse = _lse(x)
            own = _lse(x, own=True)  # MARK:own
            return lse - lax.psum(jnp.sum(jnp.exp(x - own[:, None]) * x, -1), "tp")

        return _vocab_shards(local, x, t, mesh=mesh)


    def distill(x, t):
        return -jnp.sum(jax.nn.softmax(t, -1) * jax.nn.log_softmax(x, -1), -1)


    def distill_tp(x, t, *, mesh):
        def local(x, t):
            lt, lx = _lse(t), _lse(x)
            return -lax.psum(jnp.sum(jnp.exp(t - lt[:, None]) * (x - lx[:, None]), -1), "tp")

        return _vocab_shards(local, x, t, mesh=mesh)


    def probs(x, t):
        return jnp.exp(x - jax.nn.logsumexp(x, -1, keepdims=True))


    def probs_tp(x, t, *, mesh):
        def local(x, t):
            m = lax.pmax(jnp.max(x, -1, keepdims=True), "tp")
            e = jnp.exp(x - m)
            return e / lax.psum(jnp.sum(e, -1, keepdims=True), "tp")

        return jax.shard_map(local, mesh=mesh, in_specs=(P(None, "tp"), P(None, "tp")), out_specs=P(None, "tp"),
                             check_vma=False)(x, t)
    """
)

CASES = [
    ("entropy", "entropy", "entropy_tp"),
    ("own_sum", "entropy", "entropy_own_sum"),
    ("distill", "distill", "distill_tp"),
    ("probs", "probs", "probs_tp"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES, "{tp: 4}")
    return model_package.write_package(tmp_path_factory.mktemp("log_quotients"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["entropy", "distill", "probs"])
def test_softmax_as_exp_less_lse_on_vocabulary_shards_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_the_log_of_a_device_s_own_sum_is_a_mismatch(manifest):
    result = model_package.verify_named(manifest, "own_sum")
    assert result.status is Status.MISMATCH, result.findings
