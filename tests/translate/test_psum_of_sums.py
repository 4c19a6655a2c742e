"""psum is linear: psum(a + m) = psum(a) + psum(m), and a sum of partials of disjoint contraction
shards is the full contraction (translate/collectives.py records the regrouping,
signed_sums.plain_form reads it). A sum of at least three terms, none subtracted, is also built
in one order (its terms sorted by the reference inputs they read), the all-reduce of the devices'
sums read as its terms' all-reduces: a parallel residual block's `x + psum(attn + mlp) + b1 + b2`
meets the reference's `x + (attn + b1) + (mlp + b2)`. Checked on the builder (the form, evaluated,
is the written sum) and end to end in two styles (one psum of both branches' partials with the
biases after it; the biases and the residual grouped otherwise, the reference written in another
order too); near misses: one branch's partial never reduced, a bias inside the psum (counted once
per device), both mismatch."""

from __future__ import annotations

import textwrap
from fractions import Fraction

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate import signed_sums
from equivci.translate.builder import Builder
from equivci.translate.collectives import combine

RNG = np.random.default_rng(31)
S = Shape("f32", (3, 4))


def test_a_plain_sum_with_a_psum_of_sums_is_built_in_one_order_and_is_the_written_sum():
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    p = [ev.table.make("param", (k,), (), S.dims, "f32") for k in range(7)]
    x, b1, b2 = p[0], p[5], p[6]
    members = [ev.normal("binary", ("add",), [p[1 + d], p[3 + d]], S) for d in range(2)]  # a_d + m_d
    total = combine(ev, "add", members)
    half = ev.scaled(b1, Fraction(1, 2))
    written = ev.normal("binary", ("add",), [ev.normal("binary", ("add",), [x, total], S), half], S)
    written = ev.normal("binary", ("add",), [written, b2], S)
    form = signed_sums.plain_form(ev, written)
    assert form is not None
    atoms = []
    signed_sums._collect(ev, form, Fraction(1), atoms, S, 16)
    # x, then psum(a) and psum(m) (each one all-reduce of one device term), then the biases
    assert [ev.inputs_of(t) for _, t in atoms] == [(0,), (1, 2), (3, 4), (5,), (6,)]
    assert [c for c, _ in atoms] == [1, 1, 1, Fraction(1, 2), 1]
    values = {k: RNG.standard_normal(S.dims) for k in range(7)}
    np.testing.assert_allclose(evaluate(form, values), evaluate(written, values), rtol=1e-12)


def test_a_broadcast_sum_is_the_sum_of_the_broadcasts_and_a_broadcast_difference_is_signed():
    """bcast(b1 + b2): two biases XLA adds before broadcasting them once; bcast(b1 - b2) subtracts."""
    ev = Builder(None, TermTable(), 1)  # type: ignore[arg-type]
    x, y = (ev.table.make("param", (k,), (), S.dims, "f32") for k in range(2))
    v1, v2 = (ev.table.make("param", (k,), (), (4,), "f32") for k in (2, 3))
    values = {k: RNG.standard_normal(S.dims) for k in range(2)} | {k: RNG.standard_normal(4) for k in (2, 3)}
    for op, stated in (("add", True), ("subtract", False)):
        both = ev.normal("bcast", ("n3,i0",), [ev.normal("binary", (op,), [v2, v1], Shape("f32", (4,)))], S)
        written = ev.normal("binary", ("add",), [ev.normal("binary", ("add",), [y, both], S), x], S)
        form = signed_sums.plain_form(ev, written)
        assert (form is not None) is stated
        if form is not None:
            np.testing.assert_allclose(evaluate(form, values), evaluate(written, values), rtol=1e-12)


def test_no_plain_form_for_two_terms_or_a_subtracted_one():
    ev = Builder(None, TermTable(), 1)  # type: ignore[arg-type]
    x, y, z = (ev.table.make("param", (k,), (), S.dims, "f32") for k in range(3))
    assert signed_sums.plain_form(ev, ev.normal("binary", ("add",), [y, x], S)) is None
    difference = ev.normal("binary", ("subtract",), [ev.normal("binary", ("add",), [z, x], S), y], S)
    assert signed_sums.plain_form(ev, ev.normal("binary", ("add",), [difference, x], S)) is None


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, D, F = 4, 8, 16


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return {"up": f(D, F), "down": f(F, D), "gate": f(D, F), "out": f(F, D), "b1": f(D), "b2": f(D)}, f(B, D)


    def _mlp(p, x):
        return jax.nn.gelu(x @ p["up"]) @ p["down"]


    def _branch(p, x):
        return jnp.tanh(x @ p["gate"]) @ p["out"]


    def block(p, x):
        return x + (_mlp(p, x) + p["b1"]) + (_branch(p, x) + p["b2"])


    def block_reordered(p, x):
        return (p["b2"] + _branch(p, x)) + (x + (p["b1"] + _mlp(p, x)))


    SPECS = ({"up": P(None, "tp"), "down": P("tp"), "gate": P(None, "tp"), "out": P("tp"), "b1": P(), "b2": P()},
             P("dp"))


    def _tp(body, p, x, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=SPECS, out_specs=P("dp"), check_vma=False)(p, x)


    def one_psum(p, x, *, mesh):
        return _tp(lambda p, x: x + lax.psum(_mlp(p, x) + _branch(p, x), "tp") + p["b1"] + p["b2"], p, x, mesh)


    def one_psum_grouped(p, x, *, mesh):
        def body(p, x):
            both = lax.psum(_branch(p, x) + _mlp(p, x), "tp")
            return (both + (p["b1"] + p["b2"])) + x
        return _tp(body, p, x, mesh)


    def branch_unreduced(p, x, *, mesh):
        return _tp(lambda p, x: x + lax.psum(_mlp(p, x), "tp") + _branch(p, x) + p["b1"] + p["b2"], p, x, mesh)


    def bias_in_psum(p, x, *, mesh):
        return _tp(lambda p, x: x + lax.psum(_mlp(p, x) + _branch(p, x) + p["b1"], "tp") + p["b2"], p, x, mesh)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: one-psum, reference: m.py:block, distributed: m.py:one_psum, inputs: m.py:inputs,
         mesh: {dp: 2, tp: 2}}
      - {name: one-psum-grouped, reference: m.py:block_reordered, distributed: m.py:one_psum_grouped,
         inputs: m.py:inputs, mesh: {dp: 2, tp: 2}}
      - {name: branch-unreduced, reference: m.py:block, distributed: m.py:branch_unreduced, inputs: m.py:inputs,
         mesh: {dp: 2, tp: 2}}
      - {name: bias-in-psum, reference: m.py:block, distributed: m.py:bias_in_psum, inputs: m.py:inputs,
         mesh: {dp: 2, tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("psum_of_sums"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["one-psum", "one-psum-grouped"])
def test_one_psum_of_both_branches_partials_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["branch-unreduced", "bias-in-psum"])
def test_near_miss_partials_and_biases_reduced_otherwise_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
