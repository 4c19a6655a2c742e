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


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def capture_children(tmp: Path, cli: int) -> list[int]:
    """Processes other than the CLI holding a file under `tmp` open (a capture child: its stdout and
    stderr are files in its capture folder)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == cli:
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        if any(_link(fd).startswith(str(tmp) + os.sep) for fd in fds):
            pids.append(int(entry.name))
    return pids


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:  # closed since it was listed
        return ""


def started_by(tmp: Path) -> list[int]:
    """Live processes started with TMPDIR=tmp (the CLI's, which the capture server and its forks share)."""
    mark = b"TMPDIR=" + str(tmp).encode() + b"\0"
    return [
        int(e.name) for e in Path("/proc").iterdir()
        if e.name.isdigit() and mark in _environ(e.name) and _state(e.name) not in ("Z", "")
    ]


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_capture_cleans_up(repo: Path, tmp_path: Path, signum: signal.Signals) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(repo, tmp, "--model", "slow")
    deadline = time.monotonic() + 60
    while not (started := capture_children(tmp, proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started, "the capture child never started"
    time.sleep(1.0)  # let it get into the user's code
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum.value
    assert TRACEBACK not in out + err and f"stopped by {signum.name}" in err
    assert list(tmp.iterdir()) == []  # no equivci-capture-* folder left
    deadline = time.monotonic() + 10  # the capture server ends when it sees the CLI's end
    while started_by(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started_by(tmp) == []  # no capture child, worker or server left


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
