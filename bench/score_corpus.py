"""Score equivci on the third-party model corpus (corpus/equivci.yaml against corpus/expected.yaml).

    .venv/bin/python bench/score_corpus.py [extra `equivci verify` options, e.g. --model NAME]

Runs `equivci verify --manifest corpus/equivci.yaml --format json --no-cache` and prints, per
model: the expected label, equivci's status, its first finding (path:line, notes skipped) and
whether the planted bug's line is the first finding or among them; then the summary:
soundness (buggy models not `verified`), equivalent models `verified`, false `mismatch` count
(on equivalent models), error count, and bug line first / among (over buggy models).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "equivci", "verify", "--manifest", "corpus/equivci.yaml", "--format", "json", "--no-cache"]


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f} % ({part}/{whole})" if whole else "n/a (0 cases)"


def _located(findings: list[dict]) -> list[str]:
    return [f"{f['path']}:{f['line']}" for f in findings if f.get("severity") != "note" and f.get("line")]


def score(report: dict, expected: dict) -> list[str]:
    lines = [f"{'model':40} {'expected':8} {'got':9} {'seconds':>7}  {'first finding':34} bug line"]
    equivalent = verified = buggy = sound = false_mismatch = errors = first = among = 0
    for model in report["models"]:
        label = expected[model["name"]]
        located = _located(model["findings"])
        status = model["status"]
        errors += status == "error"
        if label["equivalent"]:
            equivalent += 1
            verified += status == "verified"
            false_mismatch += status == "mismatch"
            hit = "-"
        else:
            buggy += 1
            sound += status != "verified"
            is_first = bool(located) and located[0] == label["bug_line"]
            is_among = label["bug_line"] in located
            first += is_first
            among += is_among
            hit = "first" if is_first else "among" if is_among else "missed"
        lines.append(f"{model['name']:40} {'equiv' if label['equivalent'] else 'buggy':8} {status:9} "
                     f"{model.get('seconds', 0):7.1f}  {(located[0] if located else '-'):34} {hit}")
    lines += [
        "",
        f"soundness (buggy not verified): {_pct(sound, buggy)}",
        f"equivalent verified:            {_pct(verified, equivalent)}",
        f"false mismatch:                 {false_mismatch}",
        f"errors:                         {errors}",
        f"bug line first:                 {_pct(first, buggy)}",
        f"bug line among findings:        {_pct(among, buggy)}",
    ]
    return lines


def main(argv: list[str]) -> int:
    expected = yaml.safe_load((ROOT / "corpus/expected.yaml").read_text())
    # equivci's progress lines (stderr) pass through; stdout is the JSON report.
    proc = subprocess.run([*COMMAND, *argv], check=False, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        print(f"equivci exited {proc.returncode} without a JSON report (its messages are above)", file=sys.stderr)
        return 2
    print("$ " + " ".join(["equivci", *COMMAND[3:], *argv]))
    print("\n".join(score(report, expected)))
    for model in report["models"]:
        if model["status"] in ("error", "unproven", "mismatch"):
            for f in model["findings"]:
                if f.get("severity") != "note":
                    print(f"  {model['name']} [{model['status']}] {f['path']}:{f['line']}: {f['message']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
