"""bench/mutation_tool.py: its sample is reproducible, each drawn mutant is one change of the module
that still compiles, and its interval is the Wilson score interval."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from equivci.testing.zoo import REPO

_spec = importlib.util.spec_from_file_location("mutation_tool", REPO / "bench" / "mutation_tool.py")
mt = sys.modules["mutation_tool"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mt)

MODULE = REPO / "equivci" / "terms" / "rules" / "registry.py"


def test_the_sample_is_seeded_and_each_mutant_is_one_compiling_change():
    first, population = mt.sample([MODULE], 4, seed=3)
    again, _ = mt.sample([MODULE], 4, seed=3)
    other, _ = mt.sample([MODULE], 4, seed=4)
    assert [m.text for m in first] == [m.text for m in again]
    assert [m.text for m in first] != [m.text for m in other]
    assert len(first) == 4 and population[MODULE] > 4
    original = MODULE.read_text()
    for m in first:
        assert m.text != original and " -> " in m.change
        compile(m.text, str(MODULE), "exec")


def test_the_interval_is_wilsons():
    lo, hi = mt.wilson(9, 10)
    assert lo == pytest.approx(0.5958, abs=1e-3) and hi == pytest.approx(0.9821, abs=1e-3)
    assert mt.wilson(0, 0) == (0.0, 1.0)
    rate, slo, shi = mt.stratified([(100, 9, 10), (100, 10, 10)])
    assert rate == pytest.approx(0.95) and slo < rate < shi


def test_the_run_order_takes_each_modules_kth_mutant_in_turn():
    a, b = REPO / "a.py", REPO / "b.py"
    drawn = [mt.Sampled(f"{p.name}#{k}", p, "", "") for p in (a, b) for k in range(3)] + [mt.Sampled("a.py#3", a, "", "")]
    assert [s.name for s in mt.interleaved(drawn)] == ["a.py#0", "b.py#0", "a.py#1", "b.py#1", "a.py#2", "b.py#2", "a.py#3"]


def test_a_results_file_resumes_the_mutants_it_holds_as_drawn(tmp_path):
    """A run with --results skips the drawn mutants judged before: a line counts only while its
    change is the drawn one (a module changed since has other mutants under the same name), and a
    mutant judged again replaces its line."""
    drawn, _ = mt.sample([MODULE], 2, seed=3)
    first, second = drawn
    results = tmp_path / "results.jsonl"
    outcome = mt._harness().Outcome
    mt.record(results, [outcome(first.name, "survived", ""), outcome(second.name, "crashed", "TypeError")],
              {s.name: s for s in drawn})
    assert mt.recorded(results, drawn) == {first.name: ("survived", ""), second.name: ("crashed", "TypeError")}
    moved = [first, mt.Sampled(second.name, second.path, second.text, second.change + " (another)")]
    assert mt.recorded(results, moved) == {first.name: ("survived", "")}
    mt.record(results, [outcome(first.name, "killed", "AssertionError")], {s.name: s for s in drawn})
    assert mt.recorded(results, drawn)[first.name] == ("killed", "AssertionError")
    assert len(results.read_text().splitlines()) == 2


def test_a_mutant_drawn_at_a_commit_is_carried_to_the_module_as_it_is_now():
    """A mutant drawn over a module as it was is applied where its lines are now (lines added above,
    a look-alike line told apart by its neighbours); when its lines changed, it no longer applies."""
    before = "def f(x):\n    y = x + 1\n    return y\n\ndef g(x):\n    y = x + 1\n    return -y\n"
    mutated = before.replace("def g(x):\n    y = x + 1", "def g(x):\n    y = x - 1")  # the line f has too
    now = "import os\n\n" + before
    assert mt.carried(before, mutated, now) == "import os\n\n" + mutated
    assert mt.carried(before, mutated, now.replace("def g(x):\n    y = x + 1", "def g(x):\n    y = x + 2")) is None
    assert mt.carried(before, mutated, now.replace("def g(x):", "def h(x):").replace("return -y", "return y")) is None
    assert mt.carried(before, before, now) == now


@pytest.mark.slow  # three in-process pytest runs and the harness's imports: about 10 s under load
def test_past_errors_goes_on_from_a_check_that_raises_to_one_that_asserts(tmp_path, monkeypatch):
    """A sampled mutant's checks stop at its first failed check, so one a test raises under is "killed by
    an error" even where a later test asserts against it; with --past-errors (`first` false) the checks
    go on to that assertion."""
    vm = mt._harness()
    raises, asserts = tmp_path / "test_mut_raises.py", tmp_path / "test_mut_asserts.py"
    raises.write_text("def test_raises():\n    raise TypeError('a mutant broke a call')\n")
    asserts.write_text("def test_asserts():\n    assert 1 + 1 == 3\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the harness's fork puts the mutated copy first
    monkeypatch.setenv("PYTHONPATH", "")
    job = {"name": "m", "root": str(REPO), "models": [], "pytest": [[str(raises), "-x"], [str(asserts), "-x"]]}
    verdicts = {}
    for first in (True, False):
        observed = vm._observe({**job, "first": first, "out": str(tmp_path / f"observed-{first}.json")}, captures="")
        verdicts[first] = vm.judge("m", observed, REPO / "equivci").verdict
    assert verdicts == {True: "crashed", False: "killed"}


def test_the_in_process_tests_of_a_file_leave_out_those_that_capture_models():
    ids = mt.in_process(("test_regroup.py",)).split()
    assert "tests/translate/test_regroup.py::test_only_ops_that_keep_the_groups_apart_are_regrouped" in ids
    assert not any("near_misses_are_mismatches" in i or "verifies_one_group_per_device" in i for i in ids)  # `manifest`
    assert all(i.startswith("tests/translate/test_regroup.py::test_") for i in ids) and len(ids) == 3


def test_a_mutants_tests_stop_at_the_first_failed_assertion_and_go_on_after_a_crash(tmp_path, monkeypatch):
    """Within one check, a mutant's run stops at its first failed assertion (the kill: the tests after it
    cannot change the outcome), goes on past a test that raises (a crash, which a later assertion may
    still turn into a kill), and the unmutated baseline runs every test."""
    vm = mt._harness()
    ran = tmp_path / "ran"
    checks = tmp_path / "test_mut_order.py"
    checks.write_text(
        "from pathlib import Path\n\n"
        f"RAN = Path({str(ran)!r})\n\n"
        "def test_a_raises():\n    raise TypeError('a mutant broke a call')\n\n"
        "def test_b_asserts():\n    assert 1 + 1 == 3\n\n"
        "def test_c_after():\n    RAN.write_text('ran')\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    ran_after = {}
    for name in ("m", vm.BASELINE):
        ran.unlink(missing_ok=True)
        job = {"name": name, "root": str(REPO), "models": [], "pytest": [[str(checks)]],
               "out": str(tmp_path / "observed.json")}
        observed = vm._observe(job, captures="")
        assert [node.rsplit("::", 1)[1] for node, _ in observed["pytest"][0]["failed"]] == ["test_a_raises", "test_b_asserts"]
        ran_after[name] = ran.exists()
    assert ran_after == {"m": False, vm.BASELINE: True}
