"""The verifier against the zoo's labels (which the numeric oracle in test_zoo_oracle.py confirms).

Soundness is absolute: no model labelled `different` may come out `verified`. Coverage is tracked
exactly: the correct models the engine cannot prove yet, and the buggy models whose finding does
not land on the defective line yet, are listed below with what they lack; a model that starts to
verify (or to localize) fails the test until it is taken off the list, so progress is recorded.
"""

from __future__ import annotations

import pytest

from equivci.testing.zoo import REPO, cases

ZOO = [c for c in cases() if c.manifest_rel == "configs/zoo.yaml"]

# correct model -> the relation or rule it lacks
NOT_PROVEN_YET: dict[str, str] = {}
# buggy model -> where the finding lands instead of the defective line
NOT_LOCALIZED_YET: dict[str, str] = {}
# buggy model -> why it is `unproven`, not `mismatch`, although test_zoo_oracle.py shows the oracle
# tells it apart (every buggy zoo model is labelled `different` there, and must be refuted here)
NOT_REFUTED_YET: dict[str, str] = {}


@pytest.fixture(scope="module")
def results(verify_once) -> dict[str, dict]:
    # Once per session, on a fresh cache (tests/conftest.py): with -n 2 each worker ran the whole zoo.
    run = verify_once("configs/zoo.yaml", cwd=REPO, timeout=1200)
    assert run.code in (0, 1), run.stderr[-2000:]
    assert set(run.models) == {c.name for c in ZOO}, run.stderr[-2000:]
    return run.models


def test_no_buggy_model_is_verified(results):
    for case in ZOO:
        if case.verdict == "different":
            assert results[case.name]["status"] in ("mismatch", "unproven"), (case.name, results[case.name])


def _statuses_except_listed(results, verdict: str, want: str, listed: dict[str, str], list_name: str) -> None:
    """Every zoo model labelled `verdict` gets `want`, except the listed ones, which are `unproven`
    (a listed model that gets `want` fails too, so that it is taken off the list)."""
    for case in ZOO:
        if case.verdict != verdict:
            continue
        status = results[case.name]["status"]
        if case.name in listed:
            assert status == "unproven", f"{case.name} is now {status}: take it off {list_name}"
        else:
            assert status == want, (case.name, results[case.name]["findings"])


def test_buggy_models_the_oracle_tells_apart_are_mismatch(results):
    """Not just flagged: each buggy zoo model is refuted with a counterexample, except the listed ones."""
    _statuses_except_listed(results, "different", "mismatch", NOT_REFUTED_YET, "NOT_REFUTED_YET")


def test_correct_models_verify_except_the_listed_ones(results):
    _statuses_except_listed(results, "equivalent", "verified", NOT_PROVEN_YET, "NOT_PROVEN_YET")


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
    mismatches = [name for name, result in results.items() if result["status"] == "mismatch"]
    assert mismatches, "no zoo model is `mismatch`: the test below would pass vacuously"
    for name in mismatches:
        assert any("counterexample" in f["message"] for f in results[name]["findings"]), name
