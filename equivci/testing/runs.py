"""`equivci verify --format json` over many models as parallel `--shard I/N` jobs, for the tests and
bench scripts that check the verdicts of whole manifests.

One verify process works on one model at a time, mostly on one core (Python, egglog's saturation,
one JAX child at a time): the shards run at once, so a two-core machine verifies a manifest in about
half the time, and each model's verdict is the one an unsharded run gives (the shards partition the
models; `tests/commands/test_shard_merge.py` checks that).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

SHARDS = 2  # the suite's machine has two cores


@dataclasses.dataclass(frozen=True)
class VerifyRun:
    """`models`: name -> the model's entry of the JSON report; `code`: the largest exit status of
    the shards (0 only when every shard exited 0); `stderr`: the shards' standard errors."""

    models: dict[str, dict]
    code: int
    stderr: str


def verify_json(
    manifest: Path | str,
    models: Sequence[str] = (),
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    shards: int = SHARDS,
    timeout: float = 900,
) -> VerifyRun:
    """Verify `models` of `manifest` (all when empty) in `shards` processes at once, each given
    `args` too (e.g. `--no-cache`), with `env` (default: this process's environment)."""
    count = max(1, min(shards, len(models) or shards))
    base = [sys.executable, "-m", "equivci", "verify", "--manifest", str(manifest), "--format", "json", *args]
    for name in models:
        base += ["--model", name]
    procs = [
        subprocess.Popen(
            [*base, "--shard", f"{i}/{count}"] if count > 1 else base,
            cwd=cwd,
            env=dict(os.environ if env is None else env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(1, count + 1)
    ]
    found: dict[str, dict] = {}
    codes, errors = [], []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            codes.append(proc.returncode)
            errors.append(stderr)
            try:
                found.update({m["name"]: m for m in json.loads(stdout)["models"]})
            except (ValueError, KeyError, TypeError):
                errors.append(f"no JSON report on stdout: {stdout[-500:]!r}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return VerifyRun(found, max(codes), "\n".join(errors))
