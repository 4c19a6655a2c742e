"""Fault suite: runs that are killed, run twice at once, or write to a disk that refuses; caches
that were corrupted. Real captures and proofs of a small tensor-parallel MLP (tp=2)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repos import TRACEBACK, make_repo, snapshot


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    repo = make_repo(tmp_path_factory.mktemp("runs") / "repo")
    assert subprocess.run([sys.executable, "-m", "equivci", "verify"], cwd=repo, capture_output=True, check=False).returncode == 0
    return repo


@pytest.fixture
def repo(warm: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(warm, copy, symlinks=True)
    return copy


def start(repo: Path, tmp: Path, *args: str, env: dict[str, str] | None = None, fsize: int | None = None) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "EQUIVCI_"))}
    tmp.mkdir(exist_ok=True)
    full.update({"TMPDIR": str(tmp), **(env or {})})

    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.Popen([sys.executable, "-m", "equivci", "verify", "--format", "json", *args], cwd=repo, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)  # noqa: PLW1509 - no threads here


def finish(proc: subprocess.Popen) -> tuple[int, dict | None, str]:
    out, err = proc.communicate(timeout=600)
    assert TRACEBACK not in out + err
    return proc.returncode, (json.loads(out) if out.strip() else None), err


def statuses(doc: dict) -> list[str]:
    return [m["status"] for m in doc["models"]]


def test_file_size_limit_during_capture_is_an_error_not_a_crash(repo: Path, tmp_path: Path) -> None:
    before = snapshot(repo)
    code, doc, _ = finish(start(repo, tmp_path / "tmp", "--no-cache", fsize=4096))
    assert code == 2 and statuses(doc) == ["error"]
    assert "File too large" in doc["models"][0]["findings"][0]["message"]
    assert snapshot(repo) == before and list((tmp_path / "tmp").iterdir()) == []


SLOW = pytest.mark.slow  # the default run keeps one case of each kind


@pytest.mark.parametrize("cache", ["/sys/equivci-cache", pytest.param("README-is-a-file", marks=SLOW),
                                   pytest.param("cache-under-a-file", marks=SLOW)])
def test_unwritable_cache_costs_the_cache_only(repo: Path, tmp_path: Path, cache: str) -> None:
    (repo / "README-is-a-file").write_text("x\n")
    target = {"README-is-a-file": str(repo / "README-is-a-file"), "cache-under-a-file": str(repo / "README-is-a-file" / "cache")}.get(cache, cache)
    before = snapshot(repo)
    code, doc, err = finish(start(repo, tmp_path / "tmp", env={"EQUIVCI_CACHE_DIR": target}))
    assert code == 0 and statuses(doc) == ["verified"], err
    assert "cannot write the cache" in err
    assert snapshot(repo) == before


@pytest.mark.parametrize("damage", ["garbage", pytest.param("truncated", marks=SLOW), pytest.param("folders", marks=SLOW)])
def test_damaged_cache_entries_are_ignored(repo: Path, tmp_path: Path, damage: str) -> None:
    entries = [p for p in (repo / ".equivci" / "cache" / "v1").rglob("*.json")]
    assert entries
    for path in entries:
        if damage == "truncated":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        elif damage == "folders":
            path.unlink()
            path.mkdir()
        else:
            path.write_bytes(os.urandom(64))
    code, doc, err = finish(start(repo, tmp_path / "tmp", "--changed-since", "HEAD"))
    assert code == 0 and statuses(doc) == ["verified"], err
    assert doc["models"][0]["reused"] is False  # verified anew, not from the damaged entries


def test_killed_run_then_rerun(repo: Path, tmp_path: Path) -> None:
    shutil.rmtree(repo / ".equivci")
    before = snapshot(repo)
    tmp = tmp_path / "tmp"
    proc = start(repo, tmp)
    deadline = time.monotonic() + 60
    while not any(tmp.glob("equivci-capture-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    code, doc, err = finish(start(repo, tmp_path / "tmp2"))
    assert code == 0 and statuses(doc) == ["verified"], err
    assert snapshot(repo) == before


@SLOW
def test_two_runs_at_once_share_the_cache(repo: Path, tmp_path: Path) -> None:
    shutil.rmtree(repo / ".equivci")
    procs = [start(repo, tmp_path / f"tmp{i}", "--all") for i in range(2)]
    results = [finish(p) for p in procs]
    assert [(code, statuses(doc)) for code, doc, _ in results] == [(0, ["verified"])] * 2
    code, doc, _ = finish(start(repo, tmp_path / "tmp3", "--changed-since", "HEAD"))
    assert code == 0 and doc["models"][0]["reused"] is True  # what they stored is whole
    leftovers = [p for p in (repo / ".equivci").rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
