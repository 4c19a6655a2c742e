"""Localization figures: is the bug line the first finding, or among the findings, of each buggy model?

For a manifest and its labels file (the examples/zoo/expected.yaml format: model name ->
{verdict, bug_line: "path:LINE" relative to the repository root}), runs
`equivci verify --no-cache --format json` on the manifest (or reads a saved report) and prints,
for every model labelled `different` that has a bug line, where its first finding lands, then

    first finding on the bug line: F/N (P %)
    bug line among the findings:   A/N (Q %)

    python bench/localization.py configs/zoo.yaml examples/zoo/expected.yaml
    python bench/localization.py configs/buggy.yaml examples/models/expected.yaml --save /tmp/buggy.json
    python bench/localization.py configs/zoo.yaml examples/zoo/expected.yaml --report /tmp/zoo.json

Models a manifest lists without a label, and labelled models the report lacks, are named and
left out of the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import yaml


@dataclasses.dataclass(frozen=True)
class Outcome:
    name: str
    status: str
    bug_line: str
    lines: tuple[str, ...]  # finding locations, in report order

    @property
    def rank(self) -> int | None:
        """1-based position of the first finding on the bug line, None when none is."""
        return next((k + 1 for k, line in enumerate(self.lines) if line == self.bug_line), None)


def run_report(manifest: Path, extra: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "equivci", "verify", "--manifest", str(manifest), "--no-cache",
                           "--format", "json", *extra], capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"equivci verify failed with exit status {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def outcomes(report: dict, labels: dict) -> tuple[list[Outcome], list[str]]:
    by_name = {m["name"]: m for m in report["models"]}
    found, missing = [], []
    for name, label in labels.items():
        if not isinstance(label, dict) or label.get("verdict") != "different" or not label.get("bug_line"):
            continue
        model = by_name.get(name)
        if model is None:
            missing.append(name)
            continue
        lines = tuple(f"{f['path']}:{f['line']}" for f in model["findings"] if f.get("severity") != "note")
        found.append(Outcome(name, model["status"], label["bug_line"], lines))
    return found, missing


def share(k: int, n: int) -> str:
    return f"{k}/{n} ({100.0 * k / n:.0f} %)" if n else "0/0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("labels", type=Path, help="expected.yaml-style labels with bug_line keys")
    parser.add_argument("--report", type=Path, help="read this saved `verify --format json` report instead of running")
    parser.add_argument("--save", type=Path, help="write the report that was run here")
    parser.add_argument("--only", help="comma-separated model names (passed to verify as --model)")
    args = parser.parse_args(argv)

    labels = yaml.safe_load(args.labels.read_text()) or {}
    if args.report:
        report = json.loads(args.report.read_text())
    else:
        extra = [a for name in args.only.split(",") for a in ("--model", name)] if args.only else []
        report = run_report(args.manifest, extra)
        if args.save:
            args.save.write_text(json.dumps(report))
    found, missing = outcomes(report, labels)
    if args.only:
        wanted = set(args.only.split(","))
        found, missing = [o for o in found if o.name in wanted], [m for m in missing if m in wanted]
    for o in found:
        mark = {1: "first"}.get(o.rank, f"#{o.rank}" if o.rank else "MISSED")
        shown = o.lines[0] if o.lines else "no finding"
        print(f"{mark:>6}  {o.name:<44} {o.status:<9} first: {shown:<44} bug: {o.bug_line}")
    if missing:
        print(f"not in the report: {', '.join(missing)}")
    print(f"first finding on the bug line: {share(sum(o.rank == 1 for o in found), len(found))}")
    print(f"bug line among the findings:   {share(sum(o.rank is not None for o in found), len(found))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
