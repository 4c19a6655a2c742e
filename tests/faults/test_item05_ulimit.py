"""Issue 15, item 5: a hard `ulimit -v` below the verifier's default cap (¾ of RAM)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from repos import TRACEBACK, make_repo


def under_ulimit(nbytes: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))  # soft and hard, as `ulimit -v` sets them

    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          check=False, preexec_fn=limit)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return make_repo(tmp_path_factory.mktemp("item5") / "repo")


def test_the_cap_is_the_ulimit_and_says_so(tmp_path: Path) -> None:
    probe = ("from equivci.verify.sandbox import memory_cap; from equivci.options import Options; import json; "
             "print(json.dumps(memory_cap(Options.from_env().verify_memory_bytes)))")
    cap, source = json.loads(under_ulimit(3 * 2**30, ["-c", probe], tmp_path).stdout)
    assert cap == 3 * 2**30 and "ulimit -v" in source


def test_verified_under_a_4_gib_ulimit(repo: Path) -> None:
    run = under_ulimit(4 * 2**30, ["-m", "equivci", "verify", "--format", "json", "--no-cache"], repo)
    assert TRACEBACK not in run.stdout + run.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    assert [m["status"] for m in json.loads(run.stdout)["models"]] == ["verified"]


def test_too_low_for_jax_names_the_limit(repo: Path) -> None:
    run = under_ulimit(800 * 2**20, ["-m", "equivci", "verify", "--format", "json", "--no-cache"], repo)
    assert TRACEBACK not in run.stdout + run.stderr and run.returncode == 2
    (model,) = json.loads(run.stdout)["models"]
    assert model["status"] == "error" and "`ulimit -v` (RLIMIT_AS) of 0.8 GiB" in model["findings"][0]["message"]
