"""Roundings to a narrower float moved across a sum (translate/reductions.py, collectives.py):
a dot with a bf16 result is its f32 dot rounded once (XLA accumulates a bf16 dot in f32:
`preferred_element_type=bf16` and an f32 dot cast to bf16 are one term), checked against XLA; a sum
over devices of values each rounded to bf16 is stated equal to the rounding of their sum (over the
reals a rounding is the value itself: only where it happens moves, as when a sum is re-associated
across shards), evaluated here within bf16's rounding. End to end: a row-parallel projection whose
partial sums are rounded to bf16 and psummed in bf16, in two styles (a bf16 dot; an f32 dot cast),
against a reference that rounds its f32 product once. Near misses: the psum over the wrong mesh axis
(mismatch); partial sums psummed in bf16 where the reference's output is f32 (never verified: the
rounding moves, it does not go away)."""

from __future__ import annotations

import textwrap

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
from equivci.translate.builder import Builder
from equivci.translate.collectives import combine
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(17)


def test_a_bf16_dot_is_its_f32_dot_rounded_once_and_computes_what_xla_computes():
    """(The terms' numpy semantics hold no bf16: the f32 dot is evaluated, then rounded here.)"""
    x, w = (RNG.standard_normal(s).astype(jnp.bfloat16) for s in ((6, 16), (16, 5)))

    def fn(x, w):
        return jnp.dot(x, w, preferred_element_type=jnp.bfloat16), jnp.dot(x, w, preferred_element_type=jnp.float32)

    module = parse_module(jax.jit(fn).lower(x, w).as_text(dialect="hlo"))
    table = TermTable()
    ev = Evaluator(module, table, 1)
    params = [[table.make("param", (k,), (), a.shape, "bf16")] for k, a in enumerate((x, w))]
    ((rounded, wide),) = ev.run(module.entry, params)
    assert (rounded.op, rounded.attrs, rounded.dtype) == ("unary", ("convert",), "bf16")
    assert rounded.args[0] is wide  # one f32 dot under both
    got = evaluate(wide, {0: x.astype(np.float32), 1: w.astype(np.float32)}, ev.values)
    bf16_out, f32_out = jax.jit(fn)(x, w)
    np.testing.assert_allclose(got, np.asarray(f32_out), rtol=1e-6)
    np.testing.assert_array_equal(got.astype(jnp.bfloat16), np.asarray(bf16_out))


def test_a_sum_of_values_rounded_to_bf16_is_stated_as_their_sum_rounded():
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    xs = [ev.table.make("param", (d,), (), (4, 6), "f32") for d in range(2)]
    members = [ev.normal("unary", ("convert",), [x], Shape("bf16", (4, 6))) for x in xs]
    acc = combine(ev, "add", members)
    (stated,) = [g[1] for g in ev.equal_terms if g[0] is acc]
    assert (stated.op, stated.attrs, stated.dtype) == ("unary", ("convert",), "bf16")
    total = stated.args[0]
    assert (total.op, total.attrs, total.args) == ("binary", ("add",), tuple(xs))
    # each rounded, summed in bf16 (the all-reduce) against the sum rounded once: bf16's rounding apart
    params = [RNG.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]
    summed = (params[0].astype(jnp.bfloat16) + params[1].astype(jnp.bfloat16)).astype(np.float32)
    once = (params[0] + params[1]).astype(jnp.bfloat16).astype(np.float32)
    np.testing.assert_allclose(summed, once, rtol=2**-6, atol=2**-6)


def test_a_sum_of_round_trips_through_bf16_is_stated_as_the_round_trip_of_their_sum():
    """Each device's bf16 gradient of an f32 master weight, converted back and averaged in f32."""
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    xs = [ev.table.make("param", (d,), (), (4, 6), "f32") for d in range(2)]
    narrow = [ev.normal("unary", ("convert",), [x], Shape("bf16", (4, 6))) for x in xs]
    members = [ev.normal("unary", ("convert",), [m], Shape("f32", (4, 6))) for m in narrow]
    acc = combine(ev, "add", members)
    (stated,) = [g[1] for g in ev.equal_terms if g[0] is acc]
    assert (stated.op, stated.attrs, stated.dtype) == ("unary", ("convert",), "f32")
    inner = stated.args[0]
    assert (inner.op, inner.attrs, inner.dtype) == ("unary", ("convert",), "bf16")
    assert (inner.args[0].op, inner.args[0].args) == ("binary", tuple(xs))
    params = [RNG.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]
    trips = sum(p.astype(jnp.bfloat16).astype(np.float32) for p in params)
    once = (params[0] + params[1]).astype(jnp.bfloat16).astype(np.float32)
    np.testing.assert_allclose(trips, once, rtol=2**-6, atol=2**-6)


def test_no_round_trip_is_stated_through_another_dtype_or_back_to_another():
    """f32 -> bf16 -> f64 is no round trip of the f32 values, nor f32 -> f16 -> f32 beside bf16."""
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    xs = [ev.table.make("param", (d,), (), (4, 6), "f32") for d in range(2)]
    bf16 = [ev.normal("unary", ("convert",), [x], Shape("bf16", (4, 6))) for x in xs]
    f16 = ev.normal("unary", ("convert",), [xs[1]], Shape("f16", (4, 6)))
    for members in (
        [ev.normal("unary", ("convert",), [m], Shape("f64", (4, 6))) for m in bf16],
        [ev.normal("unary", ("convert",), [m], Shape("f32", (4, 6))) for m in (bf16[0], f16)],
    ):
        before = len(ev.equal_terms)
        combine(ev, "add", members)
        assert len(ev.equal_terms) == before


def test_no_rounding_is_stated_for_members_of_mixed_sources():
    """A member that is no convert (or converts from another dtype) leaves the sum alone."""
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    x = ev.table.make("param", (0,), (), (4, 6), "f32")
    y = ev.table.make("param", (1,), (), (4, 6), "bf16")
    h = ev.table.make("param", (2,), (), (4, 6), "f16")
    rounded = ev.normal("unary", ("convert",), [x], Shape("bf16", (4, 6)))
    from_f16 = ev.normal("unary", ("convert",), [h], Shape("bf16", (4, 6)))
    for members in ([rounded, y], [rounded, from_f16]):
        before = len(ev.equal_terms)
        combine(ev, "add", members)
        assert len(ev.equal_terms) == before


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    BF16, F32 = jnp.bfloat16, jnp.float32
    B, D, F = 4, 8, 16


    def inputs():
        return (jax.ShapeDtypeStruct((B, F), F32), jax.ShapeDtypeStruct((F, D), F32))


    def project(h, w):
        return jnp.dot(h.astype(BF16), w.astype(BF16), preferred_element_type=F32).astype(BF16)


    def project_f32(h, w):
        return jnp.dot(h.astype(BF16), w.astype(BF16), preferred_element_type=F32)


    def _row_parallel(h, w, mesh, partial, axis="tp", out=lambda y: y):
        def per_device(h, w):
            return out(lax.psum(partial(h.astype(BF16), w.astype(BF16)), axis))

        return jax.shard_map(per_device, mesh=mesh, in_specs=(P("data", "tp"), P("tp")), out_specs=P("data"),
                             check_vma=False)(h, w)


    def bf16_dot(h, w, *, mesh):
        return _row_parallel(h, w, mesh, lambda h, w: jnp.dot(h, w, preferred_element_type=BF16))


    def cast_f32_dot(h, w, *, mesh):
        return _row_parallel(h, w, mesh, lambda h, w: jnp.dot(h, w, preferred_element_type=F32).astype(BF16))


    def psum_over_data(h, w, *, mesh):
        return _row_parallel(h, w, mesh, lambda h, w: jnp.dot(h, w, preferred_element_type=BF16), axis="data")


    def bf16_psum_f32_out(h, w, *, mesh):
        return _row_parallel(h, w, mesh, lambda h, w: jnp.dot(h, w, preferred_element_type=BF16),
                             out=lambda y: y.astype(F32))
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: bf16-dot, reference: m.py:project, distributed: m.py:bf16_dot, inputs: m.py:inputs,
         mesh: {data: 2, tp: 2}}
      - {name: cast-f32-dot, reference: m.py:project, distributed: m.py:cast_f32_dot, inputs: m.py:inputs,
         mesh: {data: 2, tp: 2}}
      - {name: psum-over-data, reference: m.py:project, distributed: m.py:psum_over_data, inputs: m.py:inputs,
         mesh: {data: 2, tp: 2}}
      - {name: bf16-psum-f32-out, reference: m.py:project_f32, distributed: m.py:bf16_psum_f32_out,
         inputs: m.py:inputs, mesh: {data: 2, tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("rounded_sums"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["bf16-dot", "cast-f32-dot"])
def test_partial_sums_rounded_to_bf16_and_psummed_verify(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_near_miss_psum_over_the_wrong_axis_is_a_mismatch(manifest):
    result = _verify(manifest, "psum-over-data")
    assert result.status is Status.MISMATCH, (result.status, result.findings)


def test_near_miss_bf16_psum_where_the_reference_keeps_f32_is_not_verified(manifest):
    result = _verify(manifest, "bf16-psum-f32-out")
    assert result.status is not Status.VERIFIED, result.findings
