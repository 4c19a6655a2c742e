"""`--format json`: exactly one JSON document on stdout (keys fixed by the v1 user contract)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TextIO

from equivci import __version__
from equivci.cache import result_from_json
from equivci.results import ModelResult, Report, ShardPlan


def _model(m: ModelResult) -> dict[str, Any]:
    return {
        "name": m.name,
        "status": m.status.value,
        "seconds": round(m.seconds, 3),
        "layers": {"total": m.layers.total, "verified": m.layers.verified, "reused": m.layers.reused},
        # Contract keys first (path, line, severity, layer, message), then extras such as op/changed.
        "findings": [dataclasses.asdict(f) for f in m.findings],
        "reused": m.reused,
    }


def report_to_dict(report: Report, error: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"equivci": __version__, "models": [_model(m) for m in report.models]}
    if report.shard is not None:
        doc["shard"] = dataclasses.asdict(report.shard)
    if error is not None:  # the run stopped before any model (manifest or usage error)
        doc["error"] = error
    return doc


def report_from_dict(doc: dict[str, Any]) -> tuple[Report, str | None]:
    """A report written by report_to_dict, and its run error. Raises KeyError, TypeError or
    ValueError on anything else."""
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise TypeError("no 'models' list")
    models = tuple(dataclasses.replace(result_from_json(m), reused=bool(m.get("reused"))) for m in doc["models"])
    shard = doc.get("shard")
    if shard is not None:
        shard = ShardPlan(
            index=int(shard["index"]),
            count=int(shard["count"]),
            selected=tuple(map(str, shard["selected"])),
            assigned=tuple(map(str, shard["assigned"])),
            balanced_by=str(shard["balanced_by"]),
        )
    error = doc.get("error")
    return Report(models=models, shard=shard), None if error is None else str(error)


def write_json(report: Report, out: TextIO, error: str | None = None) -> None:
    out.write(json.dumps(report_to_dict(report, error), indent=2) + "\n")
