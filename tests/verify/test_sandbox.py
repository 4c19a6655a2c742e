"""The verifier runs in a forked child: a runaway proof search becomes `unproven`, never a hang or a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from equivci.capture.types import CapturedModel
from equivci.errors import EquivciError
from equivci.manifest import Entrypoint, Manifest, ModelSpec
from equivci.options import Budgets, Options
from equivci.results import LayerCounts, ModelResult, Status
from equivci.verify import engine, sandbox

EP = Entrypoint("m.py:f", "f")
MODEL = ModelSpec("m", EP, EP, EP, (("tp", 2),))
CAPTURED = CapturedModel("m", (("tp", 2),), "", "", (), (), "/")


def manifest(tmp_path) -> Manifest:
    return Manifest(tmp_path / "equivci.yaml", tmp_path, (MODEL,))


def test_the_childs_result_comes_back(tmp_path, monkeypatch):
    verified = ModelResult("m", Status.VERIFIED, 0.1, LayerCounts(1, 1, 0))
    monkeypatch.setattr(engine, "verify_model", lambda *a: verified)
    assert sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED) == verified


def _spin(*a):
    """Uses 5 s of CPU, then claims a verdict (which a CPU limit below 5 s never lets it give)."""
    while time.process_time() < 5:
        pass
    return ModelResult("m", Status.VERIFIED, 0.1, LayerCounts(1, 1, 0))


def test_a_run_over_the_cpu_time_limit_is_unproven(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "verify_model", _spin)
    result = sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED, options=Options(verify_timeout_seconds=1.0))
    assert result.status is Status.UNPROVEN and result.limited
    message = result.findings[0].message
    assert "time limit of 1 s of CPU time (EQUIVCI_VERIFY_TIMEOUT)" in message
    assert "set EQUIVCI_VERIFY_TIMEOUT=2 to raise it" in message


def test_waiting_does_not_use_up_the_time_limit(tmp_path, monkeypatch):
    """The limit counts the child's CPU time: a child that waits twice its limit in wall time (as a
    proof does when other jobs hold the cores) still answers, so the load does not change a verdict."""
    verified = ModelResult("m", Status.VERIFIED, 0.1, LayerCounts(1, 1, 0))
    monkeypatch.setattr(engine, "verify_model", lambda *a: time.sleep(4) or verified)
    options = Options(verify_timeout_seconds=2.0)
    assert sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED, options=options) == verified


def test_a_stalled_run_ends_when_its_cpu_time_stops_advancing(tmp_path, monkeypatch):
    """A child that uses no CPU for longer than any wait of the verifier (its numeric check's time
    limit, its CPU limit) plus a margin is stalled, however long its CPU limit."""
    verified = ModelResult("m", Status.VERIFIED, 0.1, LayerCounts(1, 1, 0))
    monkeypatch.setattr(engine, "verify_model", lambda *a: time.sleep(20) or verified)
    monkeypatch.setattr(sandbox, "STALL_MARGIN", 1.0)
    options = Options(verify_timeout_seconds=1.0, budgets=Budgets(oracle_timeout_seconds=2.0))
    t0 = time.perf_counter()
    result = sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED, options=options)
    assert 3.0 <= time.perf_counter() - t0 < 20
    assert result.status is Status.UNPROVEN and result.limited
    assert "stalled: it used no CPU time for 3 s of wall time" in result.findings[0].message


def test_a_lower_ulimit_t_sets_the_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda what: (30, 60))
    assert sandbox.cpu_cap(900.0) == (30, "the `ulimit -t` (RLIMIT_CPU) equivci runs under, below EQUIVCI_VERIFY_TIMEOUT's 900 s")
    assert sandbox.cpu_cap(10.2) == (11, "EQUIVCI_VERIFY_TIMEOUT")


def test_a_run_over_the_memory_cap_is_unproven(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "verify_model", lambda *a: bytearray(2 * 2**30))
    result = sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED, options=Options(verify_memory_bytes=512 * 2**20))
    assert result.status is Status.UNPROVEN and result.limited
    assert "out of memory" in result.findings[0].message


def test_user_errors_and_bugs_keep_their_kind(tmp_path, monkeypatch):
    def user_error(*a):
        raise EquivciError("fix the manifest")

    monkeypatch.setattr(engine, "verify_model", user_error)
    with pytest.raises(EquivciError, match="fix the manifest"):
        sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED)
    monkeypatch.setattr(engine, "verify_model", lambda *a: 1 / 0)
    with pytest.raises(sandbox.VerifierCrash) as crash:
        sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED)
    assert crash.value.type_name == "ZeroDivisionError" and "Traceback" in crash.value.child_traceback


class _FreedMarker:
    """Writes a file when freed."""

    def __init__(self, path):
        self.path = path

    def __del__(self):
        self.path.write_text("freed")


def test_the_answer_goes_before_the_verifiers_data_is_freed(tmp_path, monkeypatch):
    """The child answers as verify_model returns and ends there: its data is left to the exit,
    never freed object by object first; with no monitoring tool id free, it answers after the
    return, as a plain call would."""
    import sys

    verified = ModelResult("m", Status.VERIFIED, 0.1, LayerCounts(1, 1, 0))
    marker = tmp_path / "freed"

    def verify_model(*a):
        data = _FreedMarker(marker)  # noqa: F841 - the verifier's working data
        return verified

    monkeypatch.setattr(engine, "verify_model", verify_model)
    assert sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED) == verified
    assert not marker.exists()
    taken = []
    try:
        for tool in (3, 4):  # held by other tools: the forked child inherits that
            sys.monitoring.use_tool_id(tool, "test")
            taken.append(tool)
        assert sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED) == verified
        assert marker.read_text() == "freed"
    finally:
        for tool in taken:
            sys.monitoring.free_tool_id(tool)


def test_the_draw_of_numeric_localization_never_starts_jax():
    """jax's runtime does not survive a fork (a forked child drawing inputs with jax.random hung in a
    CI run) and the verifier is forked from whatever process runs it (a test, an application that has
    run jax): its draw must not touch jax, and is the oracle's draw all the same."""
    script = textwrap.dedent(
        """
        import sys
        from equivci.capture.types import LeafPlacement
        from equivci.diagnose.numeric import draw_inputs
        leaves = (LeafPlacement("[0]", (4, 8), "bfloat16", ()), LeafPlacement("[1]", (6,), "int32", ()),
                  LeafPlacement("[2]", (3,), "bool", ()), LeafPlacement("[3]", (2, 2), "complex64", ()))
        drawn = draw_inputs(leaves, seed=2, ranges={1: (5, 9)})
        assert "jax" not in sys.modules and "jaxlib" not in sys.modules, sorted(m for m in sys.modules if "jax" in m)
        print(repr([drawn[k].tolist() for k in range(4)]))
        """
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    import jax

    from equivci.capture.oracle import random_inputs

    abstract = (jax.ShapeDtypeStruct((4, 8), "bfloat16"), jax.ShapeDtypeStruct((6,), "int32"),
                jax.ShapeDtypeStruct((3,), "bool"), jax.ShapeDtypeStruct((2, 2), "complex64"))
    oracle = random_inputs(abstract, 2, {1: (5, 9)})
    assert child.stdout.strip() == repr([np.asarray(v).tolist() for v in oracle])
    assert all(5 <= i < 9 for i in oracle[1].tolist())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_proof_child_ends_when_its_parent_is_killed(tmp_path):
    """A verify killed outright (a CI job's timeout, a scorer's SIGKILL) must not leave its proof
    child running: it would go on for minutes and hold the capture server open."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import multiprocessing, os, time
        from equivci.verify import sandbox

        def child(parent):
            sandbox._die_with_parent(parent)
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(120)

        p = multiprocessing.get_context("fork").Process(target=child, args=(os.getpid(),), daemon=True)
        p.start()
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.time() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.time() < deadline, "the child never started"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        parent.kill()
        parent.wait()
        deadline = time.time() + 10
        while _alive(child):
            assert time.time() < deadline, "the proof child outlived its killed parent"
            time.sleep(0.1)
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (its new parent has not reaped it yet) is ended too
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_result_stopped_by_a_limit_is_not_kept_in_the_memo(tmp_path, monkeypatch):
    """The limits are the run's, not part of the cache key: an `unproven` they stopped would stand in
    for the verdict a rerun with a larger limit gives. Real capture of a bundled example, twice."""
    from equivci import pipeline
    from equivci.cache import Memo
    from equivci.manifest import load_manifest
    from equivci.workspace import Workspace

    repo_manifest = load_manifest(Path(__file__).resolve().parents[2] / "equivci.yaml")
    model = next(m for m in repo_manifest.models if m.name == "mlp-tp")
    workspace = Workspace.of(repo_manifest, Options())
    memo = Memo(tmp_path / "cache")
    limited = ModelResult("mlp-tp", Status.UNPROVEN, 0.1, LayerCounts(1, 0, 0), limited=True)
    calls = []
    monkeypatch.setattr(pipeline, "verify_isolated", lambda *a: calls.append(1) or limited)
    assert pipeline.run_model(workspace, model, memo).status is Status.UNPROVEN
    assert pipeline.run_model(workspace, model, memo).status is Status.UNPROVEN
    assert len(calls) == 2  # verified again, not reported from the memo
    decided = ModelResult("mlp-tp", Status.VERIFIED, 0.1, LayerCounts(1, 1, 0))
    monkeypatch.setattr(pipeline, "verify_isolated", lambda *a: calls.append(1) or decided)
    assert pipeline.run_model(workspace, model, memo).status is Status.VERIFIED
    assert pipeline.run_model(workspace, model, memo).status is Status.VERIFIED
    assert len(calls) == 3  # a decided result is kept
