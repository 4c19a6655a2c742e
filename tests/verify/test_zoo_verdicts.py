"""The verifier against the zoo's labels (which the numeric oracle in test_zoo_oracle.py confirms).

Soundness is absolute: no model labelled `different` may come out `verified`. Coverage is tracked
exactly: the correct models the engine cannot prove yet, and the buggy models whose finding does
not land on the defective line yet, are listed below with what they lack; a model that starts to
verify (or to localize) fails the test until it is taken off the list, so progress is recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from equivci.testing.zoo import REPO, cases

ZOO = [c for c in cases() if c.manifest_rel == "configs/zoo.yaml"]

# correct model -> the relation or rule it lacks
NOT_PROVEN_YET: dict[str, str] = {}
# buggy model -> where the finding lands instead of the defective line
NOT_LOCALIZED_YET: dict[str, str] = {}


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    proc = subprocess.run([sys.executable, "-m", "equivci", "verify", "--manifest", "configs/zoo.yaml",
                           "--format", "json"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return {m["name"]: m for m in json.loads(proc.stdout)["models"]}


def test_no_buggy_model_is_verified(results):
    for case in ZOO:
        if case.verdict == "different":
            assert results[case.name]["status"] in ("mismatch", "unproven"), (case.name, results[case.name])


def test_correct_models_verify_except_the_listed_ones(results):
    for case in ZOO:
        if case.verdict != "equivalent":
            continue
        status = results[case.name]["status"]
        if case.name in NOT_PROVEN_YET:
            assert status == "unproven", f"{case.name} is now {status}: take it off NOT_PROVEN_YET"
        else:
            assert status == "verified", (case.name, results[case.name]["findings"])


def test_buggy_models_point_at_the_defective_line(results):
    for case in ZOO:
        if case.verdict != "different":
            continue
        lines = {f"{f['path']}:{f['line']}" for f in results[case.name]["findings"]}
        if case.name in NOT_LOCALIZED_YET:
            assert case.bug_line not in lines, f"{case.name} now localizes: take it off NOT_LOCALIZED_YET"
        else:
            assert case.bug_line in lines, (case.name, lines)


def test_mismatch_comes_with_a_counterexample(results):
    for name, result in results.items():
        if result["status"] == "mismatch":
            assert any("counterexample" in f["message"] for f in result["findings"]), name
