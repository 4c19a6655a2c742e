"""The cache key covers everything that decides a verdict: the verifier's own source, the versions
of equivci, Python, egglog, jax and jaxlib, and the capture options (XLA flags). Changing any of
them must miss the cache; a stale verdict from an older verifier must never come back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_api import fingerprint_of, memo
from near_miss_cases import MANIFEST

import equivci
from equivci.options import ENV_CACHE_DIR, ENV_SATURATION_ITERATIONS, ENV_SATURATION_NODES, SATURATION_ITERATIONS
from equivci.testing.zoo import REPO


def _package_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "pkg" / "equivci"
    shutil.copytree(Path(equivci.__file__).resolve().parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _file_defining(package: Path, needle: str) -> Path:
    (path,) = [p for p in package.rglob("*.py") if needle in p.read_text()]
    return path


@pytest.mark.parametrize("needle", ["def tiles(", "def _one_slot_each(", "def _dist_version("])
def test_an_edit_to_the_verifier_source_changes_the_fingerprint(tmp_path, needle):
    package = _package_copy(tmp_path)
    before = fingerprint_of(package)
    path = _file_defining(package, needle)
    path.write_text(path.read_text() + "\n# an edit that changes no behaviour still changes the key\n")
    assert fingerprint_of(package) != before, path


@pytest.mark.parametrize("dist", ["egglog", "jax", "jaxlib"])
def test_each_dependency_version_changes_the_fingerprint(monkeypatch, dist):
    monkeypatch.setattr(memo, "_FINGERPRINT", None)
    before = memo.fingerprint()
    real = memo._dist_version
    monkeypatch.setattr(memo, "_dist_version", lambda name: "9.9.9" if name == dist else real(name))
    monkeypatch.setattr(memo, "_FINGERPRINT", None)
    assert memo.fingerprint() != before


@pytest.mark.parametrize("what", ["equivci", "python"])
def test_equivci_and_python_versions_change_the_fingerprint(monkeypatch, what):
    monkeypatch.setattr(memo, "_FINGERPRINT", None)
    before = memo.fingerprint()
    if what == "equivci":
        monkeypatch.setattr(equivci, "__version__", equivci.__version__ + ".post1")
    else:
        monkeypatch.setattr(sys, "version", sys.version + " (patched)")
    monkeypatch.setattr(memo, "_FINGERPRINT", None)
    assert memo.fingerprint() != before


def _verify(cache: Path, env_extra: dict[str, str] | None = None, package_root: Path | None = None,
            model: str = "abs-of-positive") -> dict:
    env = {**os.environ, ENV_CACHE_DIR: str(cache), **(env_extra or {})}
    if package_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-P", "-m", "equivci", "verify", "--manifest", str(MANIFEST), "--model",
                           model, "--format", "json"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    (model,) = json.loads(proc.stdout)["models"]
    return {**model, "exit": proc.returncode}


def _reused(model: dict) -> bool:
    return model["layers"]["reused"] == model["layers"]["total"] > 0


def test_a_warm_cache_misses_after_a_verifier_edit_or_another_xla_flag(tmp_path):
    """End to end on one model and one cache folder: the second run reuses the first's verdict;
    a copy of equivci with one edited verifier file, another XLA flag or another saturation budget
    (iterations or size) verifies afresh. A size budget too small for any pass leaves a model whose
    proof needs the rules `unproven` (exit 1, never `mismatch`), saying so."""
    cache = tmp_path / "cache"
    first = _verify(cache)
    assert first["status"] == "verified" and not _reused(first), first
    assert _reused(_verify(cache)), "the unchanged rerun should come from the cache"
    package = _package_copy(tmp_path)
    path = _file_defining(package, "def tiles(")
    path.write_text(path.read_text() + "\n# edited\n")
    assert not _reused(_verify(cache, package_root=package.parent)), "an edited verifier reused an old verdict"
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=false"
    assert not _reused(_verify(cache, {"XLA_FLAGS": flags.strip()})), "another XLA flag reused an old verdict"
    budget = {ENV_SATURATION_ITERATIONS: str(2 * SATURATION_ITERATIONS)}
    assert not _reused(_verify(cache, budget)), "another saturation budget reused an old verdict"
    tiny = {ENV_SATURATION_NODES: "10"}
    assert not _reused(_verify(cache, tiny)), "another size budget reused an old verdict"
    # interleaved-heads is `verified` under the default budgets (test_near_misses.py)
    stopped = _verify(cache, tiny, model="interleaved-heads")
    assert (stopped["status"], stopped["exit"]) == ("unproven", 1), stopped
    (note,) = [f["message"] for f in stopped["findings"] if ENV_SATURATION_NODES in f["message"]]
    assert "past its size budget of 10," in note and f"set {ENV_SATURATION_NODES}=20 to raise it" in note, note
