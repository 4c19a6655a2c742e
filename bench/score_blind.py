#!/usr/bin/env python
"""Score equivci on a blind split: blind/<split>/equivci.yaml against blind/<split>/expected.yaml.

Runs `equivci verify --manifest blind/<split>/equivci.yaml --format json --no-cache` (the
worktree's .venv/bin/equivci), then prints one row per model (expected label, status, first
finding's path:line, whether that is the bug line, seconds) and the summary figures:
soundness (buggy models not `verified`), equivalent models `verified`, false `mismatch` count,
`error` count, buggy models whose first finding is on the bug line, and whose bug line is among
the findings.

Usage: bench/score_blind.py --split split1 [--per-model-timeout S] [--save-json F | --from-json F]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
EQUIVCI = REPO / ".venv" / "bin" / "equivci"


@dataclass
class Row:
    name: str
    category: str
    equivalent: bool
    bug: str | None
    status: str
    findings: list[str]
    seconds: float | None

    @property
    def first(self) -> str:
        return self.findings[0] if self.findings else "-"

    @property
    def first_on_bug(self) -> bool:
        return self.bug is not None and self.first == self.bug

    @property
    def bug_among(self) -> bool:
        return self.bug is not None and self.bug in self.findings


def run_equivci(manifest: Path, models: list[str] | None, timeout: float | None) -> dict:
    cmd = [str(EQUIVCI), "verify", "--manifest", str(manifest), "--format", "json", "--no-cache"]
    for name in models or []:
        cmd += ["--model", name]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          check=False)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"equivci printed no JSON report (exit {proc.returncode}): "
                 f"{(proc.stderr or proc.stdout).strip()[-2000:]}")


def run_per_model(manifest: Path, names: list[str], timeout: float) -> dict:
    """One equivci process per model, so one slow model cannot hold up the rest."""
    models = []
    for name in names:
        start = time.monotonic()
        try:
            models += run_equivci(manifest, [name], timeout)["models"]
        except subprocess.TimeoutExpired:
            models.append({"name": name, "status": "timeout",
                           "seconds": round(time.monotonic() - start, 1), "findings": []})
    return {"models": models}


def score(expected: dict, report: dict) -> list[Row]:
    by_name = {m["name"]: m for m in report["models"]}
    rows = []
    for name, label in expected.items():
        got = by_name.get(name, {"status": "missing", "findings": []})
        # a finding without a source line (a verified model's note on its int_range) prints as "-"
        findings = [f"{f['path']}:{f.get('line')}" if f.get("path") else "-" for f in got.get("findings", [])]
        rows.append(Row(name, label.get("category", "-"), bool(label["equivalent"]),
                        label.get("bug"), got["status"], findings, got.get("seconds")))
    return rows


def pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100.0 * part / whole:.0f} %)" if whole else "0/0"


def render(rows: list[Row], split: str, wall: float | None) -> str:
    header = (f"{'model':34} {'category':18} {'expected':9} {'got':10} {'s':>6}  "
              f"{'first finding':44} bug line?")
    out = [f"blind/{split}: {len(rows)} models", header]
    for r in rows:
        mark = "-" if r.equivalent else ("FIRST" if r.first_on_bug else
                                         "among" if r.bug_among else "no")
        secs = f"{r.seconds:6.1f}" if r.seconds is not None else "     -"
        out.append(f"{r.name:34} {r.category:18} {'equiv' if r.equivalent else 'buggy':9} "
                   f"{r.status:10} {secs}  {r.first:44} {mark}")
    buggy = [r for r in rows if not r.equivalent]
    equiv = [r for r in rows if r.equivalent]
    out += ["",
            f"soundness (buggy not verified):         {pct(sum(r.status != 'verified' for r in buggy), len(buggy))}",
            f"equivalent models verified:             {pct(sum(r.status == 'verified' for r in equiv), len(equiv))}",
            f"false mismatch (equivalent, mismatch):  {sum(r.status == 'mismatch' for r in equiv)}",
            f"errors:                                 {sum(r.status == 'error' for r in rows)}",
            f"other (timeout/missing):                {sum(r.status in ('timeout', 'missing') for r in rows)}",
            f"buggy, first finding on the bug line:   {pct(sum(r.first_on_bug for r in buggy), len(buggy))}",
            f"buggy, bug line among the findings:     {pct(sum(r.bug_among for r in buggy), len(buggy))}",
            f"statuses of buggy models:               {_counts(buggy)}",
            f"statuses of equivalent models:          {_counts(equiv)}"]
    if wall is not None:
        out.append(f"wall time:                              {wall:.0f} s")
    return "\n".join(out)


def _counts(rows: list[Row]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", required=True, help="folder under blind/, e.g. split1")
    ap.add_argument("--per-model-timeout", type=float, default=None,
                    help="run each model in its own equivci process with this time limit (s)")
    ap.add_argument("--save-json", type=Path, help="also write equivci's raw JSON report here")
    ap.add_argument("--from-json", type=Path, help="score a saved equivci JSON report instead")
    args = ap.parse_args(argv)
    folder = REPO / "blind" / args.split
    manifest = folder / "equivci.yaml"
    expected_path = folder / "expected.yaml"
    if not manifest.is_file() or not expected_path.is_file():
        sys.exit(f"--split {args.split}: expected {manifest} and {expected_path}; "
                 "create the split folder with both files first.")
    expected = yaml.safe_load(expected_path.read_text())
    wall = None
    if args.from_json:
        report = json.loads(args.from_json.read_text())
    else:
        start = time.monotonic()
        if args.per_model_timeout:
            report = run_per_model(manifest, list(expected), args.per_model_timeout)
        else:
            report = run_equivci(manifest, None, None)
        wall = time.monotonic() - start
        if args.save_json:
            args.save_json.write_text(json.dumps(report, indent=1) + "\n")
    print(render(score(expected, report), args.split, wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
