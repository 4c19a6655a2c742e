"""Issue 15, item 8: cancellation leaves no capture folders or processes behind; the capture time
limit is a manifest key and a CLI option."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repos import MANIFEST, TRACEBACK, make_repo, model_entry

SLOW = '''\
import time


def forward(x, w1, w2, *, mesh):
    time.sleep(120)  # stands for a capture that takes too long
'''
SLOW_MODEL = model_entry("slow", distributed="models/slow.py:forward")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return make_repo(tmp_path_factory.mktemp("item8") / "repo", {"models/slow.py": SLOW}, MANIFEST + SLOW_MODEL)


def start(repo: Path, tmp: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "EQUIVCI_"))}
    env["TMPDIR"] = str(tmp)
    return subprocess.Popen([sys.executable, "-m", "equivci", "verify", *args], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def capture_children(tmp: Path) -> list[int]:
    """Processes whose command line names a request file under `tmp` (the capture children)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and "equivci.capture.child" in cmdline and str(tmp) in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_capture_cleans_up(repo: Path, tmp_path: Path, signum: signal.Signals) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(repo, tmp, "--model", "slow")
    deadline = time.monotonic() + 60
    while not capture_children(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert capture_children(tmp), "the capture child never started"
    time.sleep(1.0)  # let it get into the user's code
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum.value
    assert TRACEBACK not in out + err and f"stopped by {signum.name}" in err
    assert list(tmp.iterdir()) == []  # no equivci-capture-* folder left
    time.sleep(0.2)
    assert capture_children(tmp) == []


@pytest.mark.parametrize("how", ["cli", "manifest"])
def test_capture_timeout_option_and_key(repo: Path, tmp_path: Path, how: str) -> None:
    if how == "manifest":
        (repo / "equivci.yaml").write_text((MANIFEST + SLOW_MODEL).replace("    mesh: {tp: 2}\n", "    mesh: {tp: 2}\n    capture_timeout: 3\n"))
        args = ["--model", "slow"]
    else:
        args = ["--model", "slow", "--capture-timeout", "3"]
    try:
        t0 = time.monotonic()
        proc = start(repo, tmp_path, "--format", "json", *args)
        out, err = proc.communicate(timeout=120)
    finally:
        (repo / "equivci.yaml").write_text(MANIFEST + SLOW_MODEL)
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 2 and TRACEBACK not in out + err
    (model,) = json.loads(out)["models"]
    message = model["findings"][0]["message"]
    assert "longer than 3 s" in message and "--capture-timeout" in message and "capture_timeout:" in message
    assert list(tmp_path.iterdir()) == []
