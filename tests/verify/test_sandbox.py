"""The verifier runs in a forked child: a runaway proof search becomes `unproven`, never a hang or a crash."""

from __future__ import annotations

import time

import pytest

from equivci.capture.types import CapturedModel
from equivci.errors import EquivciError
from equivci.manifest import Entrypoint, Manifest, ModelSpec
from equivci.options import Options
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


def test_a_run_over_the_time_limit_is_unproven(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "verify_model", lambda *a: time.sleep(60))
    t0 = time.perf_counter()
    result = sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED, options=Options(verify_timeout_seconds=1.0))
    assert time.perf_counter() - t0 < 30
    assert result.status is Status.UNPROVEN
    assert "time limit" in result.findings[0].message


def test_a_run_over_the_memory_cap_is_unproven(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "verify_model", lambda *a: bytearray(2 * 2**30))
    result = sandbox.verify_isolated(MODEL, manifest(tmp_path), CAPTURED, options=Options(verify_memory_bytes=512 * 2**20))
    assert result.status is Status.UNPROVEN
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


JAX_RUNNING = '''
import sys

import jax
import jax.numpy as jnp

from equivci.cache import Memo
from equivci.capture.run import capture_model
from equivci.manifest import load_manifest
from equivci.verify.sandbox import _start_method, verify_isolated


def main():
    jax.jit(lambda x: x + 1)(jnp.ones(3))  # jax's runtime threads run in this process now
    assert _start_method() == "forkserver"
    manifest = load_manifest(sys.argv[1])
    model = manifest.models[0]
    print(verify_isolated(model, manifest, capture_model(model, manifest), Memo(None)).status.value)


if __name__ == "__main__":
    main()
'''


def test_a_process_running_jax_gets_its_verdict_from_a_forkserver_child(tmp_path):
    """Forking a process with native threads running (a test that imported jax, an application
    embedding equivci) can leave the child waiting on a lock forever (seen in a CI run); such a
    process starts the verifier from a fresh server instead, and still gets its verdict."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "embed.py"
    script.write_text(JAX_RUNNING)
    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(script), str(repo / "equivci.yaml")], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "verified", run.stdout + run.stderr


def test_fork_only_from_a_single_threaded_process():
    import subprocess
    import sys

    probe = ("import threading, time; from equivci.verify.sandbox import _start_method; a = _start_method(); "
             "threading.Thread(target=time.sleep, args=(1,), daemon=True).start(); b = _start_method(); "
             "import jax; print(a, b, _start_method())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["fork", "forkserver", "forkserver"]
