"""The numeric oracle (product code used as evidence for `mismatch`) against known differences and
known equal pairs, through its public function (tests/soundness/engine_api.py: oracle)."""

from __future__ import annotations

import pytest
from engine_api import oracle
from near_miss_cases import MANIFEST

EQUAL = ["embed-ge-lt", "embed-gt-le", "guards-kept", "concat-straddle", "pmax-of-max", "moe-ep"]
# differences the oracle must find: a 1 % scale, a halving, a dropped id 0, a two-token slot
DIFFERENT = ["nudged", "halved", "embed-gt-drops-first", "moe-ep-shared-slot", "ppermute-self-only"]
# differences only at ids >= 4: found once integer inputs are drawn over their whole valid range
HIGH_IDS = ["guard-lt", "embed-last-shard-short", "embed-overlapping-windows"]


@pytest.fixture(scope="module")
def compared():
    results = oracle(MANIFEST, EQUAL + DIFFERENT + HIGH_IDS)
    for name, r in results.items():
        assert not isinstance(r, Exception), (name, r)
    return results


@pytest.mark.parametrize("name", EQUAL)
def test_the_oracle_accepts_equal_programs(compared, name):
    assert compared[name].equal, (name, compared[name])


@pytest.mark.parametrize("name", DIFFERENT)
def test_the_oracle_finds_a_known_difference(compared, name):
    r = compared[name]
    assert not r.equal and r.max_abs_diff > 0, (name, r)


@pytest.mark.parametrize("name", HIGH_IDS)
def test_the_oracle_draws_ids_over_their_whole_range(compared, name):
    assert not compared[name].equal, (name, compared[name])
