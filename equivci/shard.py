"""`--shard I/N`: which of the selected models one of N parallel jobs verifies.

Every job computes the same partition from the same inputs, so the N jobs together verify each
selected model exactly once:
- by name (the default): models ordered by a hash of their name and dealt round-robin, so the
  assignment depends only on the set of names (not on manifest order, not on the machine) and the
  shards differ by at most one model;
- by recorded cost (`--shard-by cost`), when the cache holds the verification time of every
  selected model: longest first, each to the least loaded shard. Only for jobs that start from
  the same cache (matrix jobs restoring one cache key): a run records new times, so the next
  run's partition may differ, and jobs with different caches may not partition the models.
Each shard's report records the partition (`Report.shard`); `equivci merge` checks that the shard
reports it joins cover every selected model exactly once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from equivci.cache import Memo
from equivci.errors import EquivciError
from equivci.results import ShardPlan
from equivci.workspace import Workspace

BY_NAME, BY_COST = "name hash", "recorded cost"


def parse(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N), 1 <= I <= N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise EquivciError(
            f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. --shard 2/4 for the second of four "
            "parallel jobs (in a GitHub Actions matrix: --shard ${{ matrix.shard }}/N with shard: [1, ..., N])."
        )
    return int(match[1]), int(match[2])


def _name_order(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def assign(names: Sequence[str], count: int, costs: Mapping[str, float] | None = None) -> tuple[dict[str, int], str]:
    """Model name -> shard (1..count), and how the shards were balanced."""
    ordered = sorted(names, key=_name_order)
    if not costs or not all(n in costs for n in names):
        return {name: i % count + 1 for i, name in enumerate(ordered)}, BY_NAME
    loads = [0.0] * count
    out: dict[str, int] = {}
    for name in sorted(ordered, key=lambda n: -costs[n]):  # stable: ties keep the hash order
        shard = loads.index(min(loads))
        loads[shard] += costs[name]
        out[name] = shard + 1
    return out, BY_COST


def recorded_costs(manifest, names: Sequence[str], cache_dir: Path | None) -> dict[str, float]:
    """Seconds of each model's last verification recorded in the cache (models never verified
    are left out)."""
    workspace = Workspace.of(manifest)
    memo = Memo(workspace.cache_dir(cache_dir))
    costs: dict[str, float] = {}
    for name in names:
        record = memo.last_capture(workspace.manifest_rel, name)
        result = memo.result(record.get("key", ""), record.get("loc_digest")) if record else None
        if result is not None:
            costs[name] = result.seconds
    return costs


def plan(
    spec: str, manifest, models: list, *, by_cost: bool, no_cache: bool, cache_dir: Path | None
) -> tuple[list, ShardPlan]:
    """This shard's models (in manifest order) and the partition its report records."""
    index, count = parse(spec)
    names = [m.name for m in models]
    costs = recorded_costs(manifest, names, cache_dir) if by_cost and not no_cache else None
    shards, by = assign(names, count, costs)
    mine = [m for m in models if shards[m.name] == index]
    return mine, ShardPlan(
        index=index, count=count, selected=tuple(names), assigned=tuple(m.name for m in mine), balanced_by=by
    )
