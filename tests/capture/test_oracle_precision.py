"""The numeric oracle on programs that compute in bfloat16: a counterexample is a difference that
rounding cannot explain (equivci/capture/rounding.py), so correct bf16 models are never a
`mismatch` while real defects in the same models still are; integer inputs are drawn over the
range the reference indexes with them (equivci/capture/index_ranges.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from equivci.capture.oracle import compare_many_in_child
from equivci.errors import EquivciError
from equivci.manifest import load_manifest

HERE = Path(__file__).parents[1] / "data" / "precision"
SEEDS = tuple(range(8))


@pytest.fixture(scope="module")
def results():
    manifest = load_manifest(HERE / "equivci.yaml")
    return manifest, compare_many_in_child(HERE / "equivci.yaml", manifest.names(), seeds=SEEDS, timeout=900)


def test_correct_bf16_models_agree_and_defects_differ_on_every_seed(results):
    manifest, by_name = results
    for model in manifest.models:
        result = by_name[model.name]
        assert not isinstance(result, EquivciError), f"{model.name}: {result}"
        if "buggy" in model.tags:
            assert not result.equal, f"{model.name}: the defect was taken for rounding: {result.describe()}"
            assert result.ratio > 1 and result.precision == "bfloat16", result
            assert re.search(r"rounding explains up to [0-9.e+-]+; the reference computes in bfloat16: [0-9.e+]+x", result.describe())
        else:
            assert result.equal, f"{model.name} is correct but the oracle calls it different: {result.describe()}"


def test_float32_tolerance_set_by_hand_calls_the_same_rounding_a_difference():
    path = HERE / "f32_tolerance.yaml"
    manifest = load_manifest(path)
    assert all(m.oracle.rtol == 1e-4 and m.oracle.atol == 1e-5 for m in manifest.models)
    by_name = compare_many_in_child(path, manifest.names(), seeds=SEEDS, timeout=900)
    differing = [name for name, r in by_name.items() if not isinstance(r, EquivciError) and not r.equal]
    # Each correct model's rounding exceeds float32's tolerance on some seed: the derived floor is what keeps them green.
    assert sorted(differing) == sorted(manifest.names()), by_name


def test_index_ranges_follow_gathers_and_one_hots_not_other_integers():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from equivci.capture.index_ranges import index_ranges

    def model(emb, ids, labels, steps):
        h = emb[ids]  # negative-index wrap, then a gather over 50 rows
        onehot = jax.nn.one_hot(labels, 7)
        return h.sum() + onehot.sum() + steps.astype(jnp.float32).sum()

    args = (jax.ShapeDtypeStruct((50, 4), jnp.float32), jax.ShapeDtypeStruct((3,), jnp.int32),
            jax.ShapeDtypeStruct((3,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.int32))
    assert index_ranges(model, args) == {1: 50, 2: 7}


def test_shadow_moves_only_roundings_of_computed_values():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from equivci.capture.rounding import shadow_reference

    f32 = jax.ShapeDtypeStruct((8, 16), jnp.float32)

    def cast_input(x):  # an input cast to bf16 rounds the same way in any program
        return x.astype(jnp.bfloat16).astype(jnp.float32) * 2

    def cast_sum(x):  # a sum cast to bf16 may round the other way after re-association
        return jnp.sum(x, axis=1).astype(jnp.bfloat16).astype(jnp.float32)

    x = jax.random.normal(jax.random.key(0), (8, 16))
    quiet = shadow_reference(cast_input, (f32,))
    assert quiet.rounding_points == 0 and float(jnp.abs(quiet.run(x)[0] - cast_input(x)).max()) == 0.0
    moved = shadow_reference(cast_sum, (f32,))
    assert moved.rounding_points == 1 and moved.narrowest == "bfloat16"
    diff = jnp.abs(moved.run(x)[0] - cast_sum(x))
    ulp = jnp.abs(jnp.nextafter(cast_sum(x).astype(jnp.bfloat16), jnp.bfloat16(jnp.inf)).astype(jnp.float32) - cast_sum(x))
    assert 0 < float(diff.max()) and bool(jnp.all(diff <= ulp * 1.01)), "at most one unit of bf16 per element"


def test_a_rounding_right_after_inexact_arithmetic_may_move_every_element():
    """round(3x) and 3 * round(x) are both correct ways to write one model (a scale before or after a
    cast): the shadow lets every element of a rounding of a value scaled by a constant take either
    neighbour, by at most one unit; a rounding of an input, of a value only moved since (sliced,
    negated, gathered), or of other arithmetic (a tanh), stays where it is."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from equivci.capture.rounding import shadow_reference

    f32 = jax.ShapeDtypeStruct((8, 16), jnp.float32)

    def scale_cast(x):
        return (x * 3.0).astype(jnp.bfloat16).astype(jnp.float32)

    def moved_cast(x):
        return (-x[:, ::-1]).astype(jnp.bfloat16).astype(jnp.float32)

    def tanh_cast(x):
        return jnp.tanh(x).astype(jnp.bfloat16).astype(jnp.float32)

    x = jax.random.normal(jax.random.key(3), (8, 16))
    shadow = shadow_reference(scale_cast, (f32,))
    want = scale_cast(x)
    diff = jnp.abs(shadow.run(x)[0] - want)
    ulp = jnp.abs(jnp.nextafter(want.astype(jnp.bfloat16), jnp.bfloat16(jnp.inf)).astype(jnp.float32) - want)
    assert shadow.rounding_points == 1 and float(jnp.mean(diff > 0)) > 0.9
    assert bool(jnp.all(diff <= ulp * 2.01)), "at most one unit of bf16 per element"
    for fixed in (moved_cast, tanh_cast):
        quiet = shadow_reference(fixed, (f32,))
        assert quiet.rounding_points == 0 and float(jnp.abs(quiet.run(x)[0] - fixed(x)).max()) == 0.0


def test_a_routing_decision_within_rounding_of_a_tie_is_reported():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax import lax

    from equivci.capture.rounding import shadow_reference

    def router(x, w):  # bf16 router logits, as MoE code computes them
        logits = jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)).astype(jnp.float32)
        return lax.top_k(logits, 2)[1]

    args = (jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((32, 8), jnp.float32))
    shadow = shadow_reference(router, args)
    x, w = jax.random.normal(jax.random.key(1), (64, 32)), jax.random.normal(jax.random.key(2), (32, 8))
    assert not bool(shadow.run(x, w)[1])
    twins = w.at[:, 1].set(w[:, 0] * 1.001)  # two experts within a bf16 unit of each other for every token
    assert bool(shadow.run(x, twins)[1])


def test_a_max_compared_with_its_own_elements_or_a_mask_value_is_no_tie():
    """max's derivative compares each element with the max taken over it (equal to the bit), and masks
    compare with -inf: neither is near a tie, so a training step's seeds are not all excused; two
    values within rounding of each other still are."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from equivci.capture.rounding import shadow_reference

    def loss(x, w):
        logits = jnp.dot(x, w)
        scores = jnp.where(jnp.arange(8) < 6, logits, -jnp.inf)
        return jax.grad(lambda s: jnp.sum(jnp.max(jnp.where(jnp.isfinite(s), s, -1e9), axis=-1)))(scores)

    def near(x, w):
        logits = jnp.dot(x, w)
        return jnp.where(logits[:, 0] > logits[:, 1], 1.0, 0.0)

    args = (jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((32, 8), jnp.float32))
    x, w = jax.random.normal(jax.random.key(1), (64, 32)), jax.random.normal(jax.random.key(2), (32, 8))
    assert not bool(shadow_reference(loss, args).run(x, w)[1])
    twins = w.at[:, 1].set(w[:, 0] * (1 + 1e-7))  # the two columns' dots within f32 re-association of each other
    assert bool(shadow_reference(near, args).run(x, twins)[1])
    assert not bool(shadow_reference(near, args).run(x, w)[1])


def test_seeds_near_a_tie_are_no_counterexample():
    from equivci.capture.oracle import NumericComparison, without_near_ties

    differs = NumericComparison(3.0, 1.0, "", (0,), 1.0, 4.0, (0, 1, 2), False, 1, (1, 2), noise_floor=0.1, ratio=30.0)
    partly = without_near_ties(differs, [2])
    assert not partly.equal and partly.failing_seeds == (1,) and "seed 2" in partly.note
    excused = without_near_ties(differs, [1, 2])
    assert excused.equal and excused.failing_seeds == () and "within rounding of a tie" in excused.describe()
    assert without_near_ties(differs, []) == differs


def test_counts_summed_from_one_hots_are_exact_so_a_capacity_comparison_is_no_tie():
    """A float sum of integers is exact in any order while its partial sums stay below 2/eps, so
    capacity slots made by a cumsum of one-hot masks are the same in every program: comparing them
    with the capacity (or truncating them to int) is no tie. Sums of non-integers, and integer sums
    past the type's contiguous integers, are still checked."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from equivci.capture.rounding import shadow_reference

    def slots(x, w):  # switch routing: argmax expert, a slot by cumsum of the one-hot, kept under capacity
        one_hot = jax.nn.one_hot(jnp.argmax(jnp.dot(x, w), axis=-1), 8)  # made inside a jit call
        position = jnp.sum(jnp.cumsum(one_hot, axis=0) * one_hot, axis=-1)
        return (position < 4).astype(jnp.int32) + position.astype(jnp.int32)

    def scaled(x, w):  # the same counts summed in tenths: no longer exact, so truncating them is checked
        one_hot = (jnp.argmax(jnp.dot(x, w), axis=-1)[:, None] == jnp.arange(8)).astype(jnp.float32)
        return (jnp.cumsum(one_hot * 0.1, axis=0) * 10).astype(jnp.int32)

    def counts_in_half(rows):  # float16 holds the integers up to 2048 = 2/eps exactly, and no further
        def counts(x, w):
            ones = jnp.tile((jnp.dot(x, w) > 0).astype(jnp.float16), (rows // 64, 1))
            return jnp.cumsum(ones, axis=0).astype(jnp.int32)

        return counts

    args = (jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((32, 8), jnp.float32))
    x, w = jax.random.normal(jax.random.key(1), (64, 32)), jax.random.normal(jax.random.key(2), (32, 8))
    out, tie = shadow_reference(slots, args).run(x, w)
    assert not bool(tie) and bool(jnp.any(out >= 4)), "some expert overflows its capacity and is no tie"
    assert bool(shadow_reference(scaled, args).run(x, w)[1])
    assert not bool(shadow_reference(counts_in_half(2048), args).run(x, w)[1])
    assert bool(shadow_reference(counts_in_half(4096), args).run(x, w)[1])


@pytest.mark.parametrize("seed", range(4))
def test_integer_sums_below_two_over_eps_are_the_same_in_any_order(seed):
    """The fact the shadow relies on, numerically: every order of summing integers whose total
    magnitude is at most 2/eps of the type gives the same result."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for dtype, limit in ((np.float32, 2.0**24), (np.float16, 2.0**11)):
        terms = rng.integers(-40, 41, size=256)
        terms = terms * (limit // max(1, np.abs(terms).sum()))
        assert np.abs(terms).sum() <= limit
        sums = {float(np.cumsum(rng.permutation(terms).astype(dtype), dtype=dtype)[-1]) for _ in range(20)}
        assert sums == {float(terms.sum())}
