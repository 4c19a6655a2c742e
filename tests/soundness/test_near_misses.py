"""Every near-miss pair through the public entry point, `equivci verify --format json`, on a fresh
cache: buggy variants are never `verified` (and `mismatch` where the oracle shows the difference),
correct ones are `verified`. Each buggy variant differs from a correct one only where one side
condition of the verifier matters (see bench/verifier_mutants.py for which guard each protects).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from near_miss_cases import EXPECTED, MANIFEST, agrees
from equivci.testing.zoo import REPO

HALVES = 2  # two verify processes at once: the suite runs on two cores


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    names = list(EXPECTED)
    procs = []
    for k in range(HALVES):
        cache = tmp_path_factory.mktemp(f"cache{k}")
        cmd = [sys.executable, "-m", "equivci", "verify", "--manifest", str(MANIFEST), "--format", "json"]
        for name in names[k::HALVES]:
            cmd += ["--model", name]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "EQUIVCI_CACHE_DIR": str(cache)}))
    out = {}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode in (0, 1), stderr[-2000:]
        out.update({m["name"]: m for m in json.loads(stdout)["models"]})
    assert set(out) == set(EXPECTED)
    return out


@pytest.mark.parametrize("name", list(EXPECTED))
def test_near_miss_verdict(results, name):
    result = results[name]
    assert agrees(name, result["status"]), (name, EXPECTED[name], result["status"], result["findings"])
    if result["status"] == "mismatch":
        assert any("counterexample" in f["message"] for f in result["findings"]), result["findings"]


def test_routing_limit_is_named(results):
    """A correct MoE layer past the routing lemma's enumeration limit (16 tokens per device) is
    `unproven`, and its finding says the limit was the reason."""
    result = results["moe-ep-past-enumeration"]
    assert result["status"] == "unproven", result
    messages = " ".join(f["message"] for f in result["findings"])
    assert any(word in messages for word in ("enumerat", "4096", "limit")), messages


def test_every_near_miss_model_has_an_expected_verdict():
    from equivci.manifest import load_manifest

    assert {m.name for m in load_manifest(MANIFEST).models} == set(EXPECTED)
