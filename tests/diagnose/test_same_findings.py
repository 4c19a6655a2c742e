"""The same models give the same findings on every run: whatever the hash seed (the order of sets
of names), the time limit, or which model of the run came first (the in-run memo). The
localization's bounds are counts of ops and passes, never seconds, so a loaded machine does not
move a finding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from model_package import write_package
from test_handed_value import MANIFEST, MODEL

from equivci.options import ENV_VERIFY_TIMEOUT

MODELS = ["causal-strict", "windowed-inclusive"]


def _findings(manifest_path, models: list[str], env_extra: dict[str, str]) -> dict[str, list]:
    env = {**os.environ, **env_extra}
    args = [a for m in models for a in ("--model", m)]
    proc = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "equivci",
            "verify",
            "--manifest",
            str(manifest_path),
            *args,
            "--no-cache",
            "--format",
            "json",
        ],
        cwd=manifest_path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return {m["name"]: [(m["status"], f) for f in m["findings"]] for m in json.loads(proc.stdout)["models"]}


def test_findings_do_not_depend_on_hash_seed_time_limit_or_model_order(tmp_path):
    manifest = write_package(tmp_path, "model.py", MODEL, MANIFEST)
    first = _findings(manifest.path, MODELS, {"PYTHONHASHSEED": "0", ENV_VERIFY_TIMEOUT: "900"})
    second = _findings(manifest.path, MODELS[::-1], {"PYTHONHASHSEED": "4242", ENV_VERIFY_TIMEOUT: "600"})
    assert set(first) == set(MODELS)
    assert first == second
    assert all(status == "mismatch" for rows in first.values() for status, _ in rows)
