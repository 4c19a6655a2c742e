"""Fixtures shared by the test modules that run equivci on real temporary git repositories, and by
the modules that verify a whole manifest once."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from equivci import options
from equivci.testing.runs import VerifyRun, verify_json


@pytest.fixture()
def repo(warm_template: Path, tmp_path: Path, monkeypatch) -> Path:
    """A fresh copy of the module's `warm_template` repository (its cache included), so each test
    starts from the same committed, already verified state."""
    monkeypatch.delenv(options.ENV_CACHE_DIR, raising=False)
    copy = tmp_path / "repo"
    shutil.copytree(warm_template, copy, symlinks=True)
    return copy


@pytest.fixture(scope="session")
def verify_once(tmp_path_factory, worker_id):
    """`verify_json` for the module fixtures that verify many models at once (the zoo, the near
    misses), run once per test session. Under `pytest -n N` every worker that takes one of a module's
    tests sets up its module fixtures, so each worker verified the whole zoo (two workers: twice the
    work). The first worker to ask runs it, holding a lock in the session's shared temporary folder;
    another that asks the same meanwhile waits for it (the run's shards use the cores) and reads its
    result. The key is what the run is asked: the manifest, the models and the arguments."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    runs = shared / "verify-once"
    runs.mkdir(exist_ok=True)

    def run(manifest, models=(), *, cwd: Path, args=(), timeout: float = 900, fresh_cache: bool = True) -> VerifyRun:
        key = hashlib.sha256(repr((str(manifest), sorted(models), list(args), str(cwd))).encode()).hexdigest()[:20]
        done = runs / f"{key}.json"
        with open(runs / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if done.exists():
                return VerifyRun(**json.loads(done.read_text()))
            # A fresh cache: verdicts written by an older verifier into .equivci/cache must not stand in.
            env = {**os.environ, options.ENV_CACHE_DIR: str(runs / f"{key}-cache")} if fresh_cache else None
            result = verify_json(manifest, models, cwd=cwd, env=env, args=args, timeout=timeout)
            done.write_text(json.dumps(dataclasses.asdict(result)))
            return result

    return run
