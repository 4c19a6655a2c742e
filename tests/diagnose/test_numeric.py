"""Numeric localization's matching: a distributed value matches a reference value when it is one
of its shards (a block of a grid) or, summed over a mesh axis, one; within the dtype's tolerance
measured against the value's own magnitude."""

import numpy as np

from equivci.diagnose.numeric import _partial, _ReferenceIndex

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
