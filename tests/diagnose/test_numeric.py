"""Numeric localization's matching: a distributed value matches a reference value when it is one
of its shards (a block of a grid) or, summed over a mesh axis, one; within the dtype's tolerance
measured against the value's own magnitude."""

import textwrap

import numpy as np
import pytest
from model_package import capture_named, line_of, programs_of, write_package

from equivci.diagnose.frames import innermost
from equivci.diagnose.numeric import _partial, _ReferenceIndex, numeric_frontier
from equivci.hlo.collectives import axis_groups

RNG = np.random.default_rng(0)


def index_of(*values: np.ndarray) -> _ReferenceIndex:
    index = _ReferenceIndex()
    for v in values:
        index.add(v)
    return index


def test_a_shard_matches_and_a_changed_value_does_not():
    ref = RNG.normal(size=(8, 32)).astype(np.float32)
    index = index_of(ref)
    assert index.matches(ref[:, 16:24].copy())
    assert index.matches(ref + np.float32(1e-7))  # rounding
    assert not index.matches(ref[:, 16:24] * 2)
    assert not index.matches(ref[:, 4:12].copy())  # not on the grid of 8-wide shards


def test_a_huge_reference_value_does_not_match_everything():
    # an exp that overflows in the reference must not swallow every value of its shape
    index = index_of(np.full((8, 16), 1e30, np.float32))
    assert not index.matches(RNG.normal(size=(8, 16)).astype(np.float32))


def test_a_partial_sum_matches_through_its_axis():
    ref = RNG.normal(size=(4, 8)).astype(np.float32)
    parts = [RNG.normal(size=(4, 8)).astype(np.float32) for _ in range(3)]
    parts.append(ref - sum(parts))
    index = index_of(ref)
    assert not index.matches(parts[0])
    assert _partial(index, parts, 0, {"tp": [[0, 1, 2, 3]]})
    assert not _partial(index, parts, 0, {"tp": [[0, 1], [2, 3]]})


def test_a_value_of_a_kind_the_reference_never_computes_has_no_counterpart():
    # the device's index (a scalar) differs from nothing; a row block of a mask could be a shard
    index = index_of(np.arange(16, dtype=np.int32).reshape(4, 4), RNG.normal(size=(8,)).astype(np.float32))
    assert not index.has_kind(np.int32(3).reshape(()))
    assert index.has_kind(np.zeros((2, 4), np.int32))
    assert not index.has_kind(np.zeros((3, 4), np.int32))  # 3 rows cannot tile 4
    assert not index.has_kind(np.zeros((2, 4), np.float32))  # no float value of rank 2


# -- the frontier on captured programs: a value computed in another form is a step, not a difference --

STEPS = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P


    def inputs():
        return jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((8, 16), jnp.float32)


    def ref(x, g):
        h = (0.5 * g) * g
        s = jnp.log(jnp.sum(jnp.exp(x - jnp.max(x, axis=-1, keepdims=True)), axis=-1))
        return (h + x) / 3.0, s


    def _rows(body, x, g, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P(None, "tp")),
                             out_specs=(P(None, "tp"), P()))(x, g)


    def _stable_lse(x):
        m = lax.pmax(jnp.max(x, axis=-1, keepdims=True), "tp")  # MARK:local_max
        return jnp.log(lax.psum(jnp.sum(jnp.exp(x - m), axis=-1), "tp"))


    def wrong_scale(x, g, *, mesh):
        def body(x, g):
            h = 0.5 * jnp.square(g)  # MARK:square
            return (h + x) / 4.0, _stable_lse(x)  # MARK:scale

        return _rows(body, x, g, mesh)


    def square_kept(x, g, *, mesh):
        def body(x, g):
            h = jnp.square(g)  # MARK:kept
            return (h + x) / 3.0, _stable_lse(x)  # MARK:kept_use

        return _rows(body, x, g, mesh)
    """
).lstrip()

STEPS_MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:ref, distributed: model.py:{name}, inputs: model.py:inputs, "
    "mesh: {tp: 2}}\n"
    for name in ("wrong_scale", "square_kept")
)


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("numeric_steps"), "model.py", STEPS, STEPS_MANIFEST)


def _frontier_line(manifest, name: str) -> int | None:
    captured = capture_named(manifest, name)
    programs = programs_of(captured)
    found = numeric_frontier(
        programs.reference_events,
        programs.distributed_events,
        programs.evaluator.values,
        captured.inputs,
        axis_groups(captured.mesh),
        len(programs.evaluator.table),
        programs.routed,
    )
    assert found.event is not None, found
    return innermost(found.event.inst)[1]


def test_values_computed_in_another_form_are_steps_and_the_frontier_is_the_changed_op(steps):
    # g**2 (then * 0.5) where the reference computes (0.5*g)*g, and each device's local max before
    # its pmax, match no reference value but lead only to values that match: not the frontier
    assert _frontier_line(steps, "wrong_scale") == line_of(STEPS, "scale")


def test_near_miss_a_value_whose_use_never_matches_again_is_the_frontier(steps):
    # the same square, but no use of it turns back into a reference value: it is where they part
    assert _frontier_line(steps, "square_kept") == line_of(STEPS, "kept")
