"""The README's promise: bundled examples verify; each buggy example is refuted at its defective line.

Runs the real CLI (capture in child processes on fake CPU devices, egglog proof, numeric
counterexample) and checks the verdicts against examples/models/expected.yaml, whose labels the
numeric oracle in test_zoo_oracle.py confirms independently.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from equivci.manifest import load_manifest
from equivci.testing.runs import verify_json

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = yaml.safe_load((ROOT / "examples/models/expected.yaml").read_text())


def run_verify(manifest: str, cache: Path) -> tuple[int, dict]:
    """The CLI's verdicts on a fresh cache (never the repository's .equivci/cache, whose entries an
    older verifier may have written)."""
    run = verify_json(manifest, cwd=ROOT, env={**os.environ, "EQUIVCI_CACHE_DIR": str(cache)}, timeout=600)
    assert set(run.models) == {m.name for m in load_manifest(ROOT / manifest).models}, run.stderr[-2000:]
    return run.code, {"models": list(run.models.values())}


def test_bundled_examples_verify(tmp_path):
    code, report = run_verify("equivci.yaml", tmp_path)
    statuses = {m["name"]: m["status"] for m in report["models"]}
    assert statuses and all(s == "verified" for s in statuses.values()), statuses
    assert all(EXPECTED[name]["verdict"] == "equivalent" for name in statuses)
    assert code == 0


def test_buggy_examples_are_refuted_at_the_defective_line(tmp_path):
    code, report = run_verify("configs/buggy.yaml", tmp_path)
    assert code == 1
    assert report["models"]
    for model in report["models"]:
        expected = EXPECTED[model["name"]]
        assert expected["verdict"] == "different"
        assert model["status"] in ("mismatch", "unproven"), model
        assert model["status"] != "verified"
        lines = {f"{f['path']}:{f['line']}" for f in model["findings"]}
        assert expected["bug_line"] in lines, (model["name"], lines)
