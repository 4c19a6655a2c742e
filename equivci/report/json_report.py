"""`--format json`: exactly one JSON document on stdout (keys fixed by the v1 user contract)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TextIO

from equivci import __version__
from equivci.results import ModelResult, Report


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
    if error is not None:  # the run stopped before any model (manifest or usage error)
        doc["error"] = error
    return doc


def write_json(report: Report, out: TextIO, error: str | None = None) -> None:
    out.write(json.dumps(report_to_dict(report, error), indent=2) + "\n")
