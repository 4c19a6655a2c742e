"""Join the JSON reports of parallel equivci runs (`verify --shard I/N`) into one report.

Shard reports carry their partition (`"shard"`: index, count, the models selected before
sharding and the ones this shard took): the merge insists that they are the N shards of one
selection, each model reported exactly once, and orders the models as the unsharded run would
(manifest order). Reports without a partition (separate manifests, hand-picked --model runs) are
concatenated, as long as no model name repeats.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from equivci.errors import EquivciError
from equivci.report.json_report import report_from_dict
from equivci.results import Report

FIX = "Pass the report.json of every shard of one run (`equivci verify --shard I/N --format json`), each exactly once."


def read_report(path: Path) -> tuple[Report, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EquivciError(f"cannot read the report {path}: {exc.strerror or exc}. {FIX}") from None
    try:
        return report_from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise EquivciError(
            f"{path} is not an equivci JSON report ({type(exc).__name__}: {exc}); write one with "
            f"`equivci verify --format json > {path.name}`. {FIX}"
        ) from None


def _check_shards(named: list[tuple[Path, Report]]) -> tuple[str, ...]:
    """The models of the whole selection, in manifest order, when the shard reports cover it."""
    unsharded = [str(path) for path, r in named if r.shard is None]
    if unsharded:
        raise EquivciError(
            f"{', '.join(unsharded)} {'is' if len(unsharded) == 1 else 'are'} not a shard report "
            f"(no --shard) but the other reports are. {FIX}"
        )
    plans = [(path, r.shard) for path, r in named if r.shard is not None]
    first_path, first = plans[0]
    for path, plan in plans[1:]:
        if (plan.count, plan.selected) != (first.count, first.selected):
            raise EquivciError(
                f"{path} is shard {plan.index}/{plan.count} of a different run than {first_path} "
                f"(shard {first.index}/{first.count}): the shard counts or the selected models differ. {FIX}"
            )
    seen = Counter(plan.index for _, plan in plans)
    twice = sorted(i for i, n in seen.items() if n > 1)
    missing = sorted(set(range(1, first.count + 1)) - set(seen))
    if twice or missing:
        parts = ([f"shard(s) {', '.join(map(str, twice))} given more than once"] if twice else []) + (
            [f"shard(s) {', '.join(map(str, missing))} of {first.count} missing"] if missing else []
        )
        raise EquivciError(f"the reports do not make one whole run: {'; '.join(parts)}. {FIX}")
    taken = Counter(name for _, plan in plans for name in plan.assigned)
    doubled = sorted(n for n, c in taken.items() if c > 1)
    left = [n for n in first.selected if n not in taken]
    if doubled or left:
        raise EquivciError(
            "the shards did not partition the models"
            + (f": {', '.join(doubled)} verified by more than one shard" if doubled else "")
            + (f"; {', '.join(left)} by none" if left else "")
            + ". With --shard-by cost every job must start from the same cache; use --shard-by name "
            "(the default) otherwise, and rerun the shards."
        )
    return first.selected


def merge(paths: list[Path]) -> Report:
    """The merged report."""
    if not paths:
        raise EquivciError(f"no report to merge. {FIX}")
    named = [(path, *read_report(path)) for path in paths]
    errors = [f"{path}: {error}" for path, _, error in named if error is not None]
    if errors:  # that run stopped before verifying anything: its share of the models is unknown
        raise EquivciError(f"{len(errors)} of the runs failed before verifying: {' '.join(errors)}")
    reports = [(path, report) for path, report, _ in named]
    models = [m for _, report in reports for m in report.models]
    repeated = sorted(n for n, c in Counter(m.name for m in models).items() if c > 1)
    if repeated:
        raise EquivciError(f"model(s) {', '.join(repeated)} appear in more than one report. {FIX}")
    if any(report.shard is not None for _, report in reports):
        order = {name: i for i, name in enumerate(_check_shards(reports))}
        models.sort(key=lambda m: order.get(m.name, len(order)))
    return Report(models=tuple(models))
