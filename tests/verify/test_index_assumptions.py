"""The numeric oracle and the proof assume the same inputs: an integer input the reference uses
as an index (here a position whose window `pos - 3 + arange(4)` must stay inside the cache) is
drawn only where the proof took it to be valid. Outside, numpy wraps the reference's negative
index while HLO clamps the distributed slice start: a difference there is no counterexample."""

from __future__ import annotations

import dataclasses
import textwrap

import model_package
import pytest
from model_package import capture_named, model_named, programs_of

from equivci.capture.oracle import compare_in_child
from equivci.hlo.parser import parse_module
from equivci.prove.programs import build_programs
from equivci.results import Status
from equivci.verify.engine import oracle_ranges, verify_model

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    W = 4


    def inputs():
        return (jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32),
                jax.ShapeDtypeStruct((), jnp.int32))


    def reference(cache, x, pos):
        cache = cache.at[pos].set(x)
        return cache[pos - (W - 1) + jnp.arange(W)].sum(0)  # numpy indexing: a negative index wraps


    def _sliced(cache, x, pos, mesh, start):
        cache = jax.lax.with_sharding_constraint(cache, NamedSharding(mesh, P(None, "tp")))
        cache = lax.dynamic_update_slice(cache, x[None, :], (pos, 0))
        return lax.dynamic_slice(cache, (start, 0), (W, cache.shape[1])).sum(0)  # HLO clamps the start


    def distributed(cache, x, pos, mesh):
        return _sliced(cache, x, pos, mesh, pos - (W - 1))


    def distributed_late(cache, x, pos, mesh):
        return _sliced(cache, x, pos, mesh, pos - (W - 2))
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: window, reference: win.py:reference, distributed: win.py:distributed, inputs: win.py:inputs, mesh: {tp: 2}}
      - {name: late, reference: win.py:reference, distributed: win.py:distributed_late, inputs: win.py:inputs, mesh: {tp: 2}}
    """
)
SEEDS = tuple(range(12))  # enough that positions 0-2 are drawn when nothing narrows them


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("window_models"), "win.py", MODELS, MANIFEST)


def test_the_oracle_draws_positions_where_the_proof_assumed_them_valid(manifest):
    model = model_named(manifest, "window")
    assumed = programs_of(capture_named(manifest, "window")).assumed
    assert {k: r for k, (r, _) in assumed.items()} == {2: (3, 15)}  # pos - 3 >= 0 and pos <= 15
    ranges = oracle_ranges(model, assumed)
    assert ranges == {2: (3, 16)}
    assert compare_in_child(manifest.path, "window", SEEDS, ranges=ranges).equal
    # The same draw over every position the cache write takes finds the wrapped windows: the
    # programs do differ there, which is why the proof states its assumption in a note.
    assert not compare_in_child(manifest.path, "window", SEEDS).equal
    # A manifest that refuses the assumption gets the unnarrowed draw.
    assert oracle_ranges(dataclasses.replace(model, assume_valid_indices=False), assumed) == {}


def test_a_window_one_row_late_still_differs_inside_the_assumed_range(manifest):
    ranges = oracle_ranges(model_named(manifest, "late"), programs_of(capture_named(manifest, "late")).assumed)
    comparison = compare_in_child(manifest.path, "late", SEEDS[:3], ranges=ranges)
    assert not comparison.equal and comparison.failing_seeds


def test_a_stated_range_bounds_every_integer_input(manifest):
    """`int_range: [5, 9]` is [5, 8] for the proof, narrowed further by no index use here (the
    reference's [3, 15] holds it), and [5, 9) for the oracle; a refused index assumption keeps it."""
    captured = capture_named(manifest, "window")
    model = dataclasses.replace(model_named(manifest, "window"), int_range=(5, 9))
    programs = build_programs(
        parse_module(captured.reference_hlo),
        parse_module(captured.distributed_hlo),
        captured.inputs,
        captured.outputs,
        captured.num_devices,
        int_range=model.int_range,
    )
    pos = programs.params[2]
    assert programs.evaluator.bounds_of(pos) == (5, 8)
    assert oracle_ranges(model, programs.assumed, captured.inputs) == {2: (5, 9)}
    refused = dataclasses.replace(model, assume_valid_indices=False)
    assert oracle_ranges(refused, programs.assumed, captured.inputs) == {2: (5, 9)}


def test_a_counterexample_says_which_integers_were_drawn_unless_the_manifest_states_them(manifest):
    """Code right only for the ids it is meant for differs outside them: the reader of a
    counterexample learns the draw (here the position inside the proof's assumed [3, 15]) and how to
    state the intended values; with `int_range` stated the draw is the user's, and nothing is said."""
    model = model_named(manifest, "late")
    captured = capture_named(manifest, "late")
    found = verify_model(model, manifest, captured)
    assert found.status is Status.MISMATCH
    message = next(f.message for f in found.findings if f.message.startswith("counterexample"))
    assert "the integer inputs were drawn as input [2] in [3, 16)" in message and "`int_range" in message
    stated = verify_model(dataclasses.replace(model, int_range=(3, 16)), manifest, captured)
    assert stated.status is Status.MISMATCH
    assert not any("drawn as" in f.message for f in stated.findings)
