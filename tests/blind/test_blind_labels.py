"""The blind splits' labels: consistent files (fast) and confirmed by the independent oracle (slow)."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BLIND = REPO / "blind"
SPLITS = sorted(p.name for p in BLIND.iterdir() if (p / "equivci.yaml").is_file())


def _load(split: str) -> tuple[dict, dict]:
    folder = BLIND / split
    manifest = yaml.safe_load((folder / "equivci.yaml").read_text())
    expected = yaml.safe_load((folder / "expected.yaml").read_text())
    return manifest, expected


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_there_is_a_split():
    assert SPLITS, f"no blind/<split>/equivci.yaml under {BLIND}"


@pytest.mark.parametrize("split", SPLITS)
def test_manifest_and_expected_agree(split):
    manifest, expected = _load(split)
    names = [m["name"] for m in manifest["models"]]
    assert len(names) == len(set(names)), "duplicate model names in the manifest"
    assert set(names) == set(expected), (
        f"only in manifest: {set(names) - set(expected)}; only in expected: {set(expected) - set(names)}")
    for m in manifest["models"]:
        assert 2 <= math.prod(m["mesh"].values()) <= 8, f"{m['name']}: mesh of 2-8 devices"
        for key in ("reference", "distributed", "inputs"):
            file, func = m[key].rsplit(":", 1)
            path = BLIND / split / file
            assert path.is_file(), f"{m['name']}.{key}: {path} does not exist"
            assert func in _top_level_names(path), f"{m['name']}.{key}: {func} not defined in {path}"


@pytest.mark.parametrize("split", SPLITS)
def test_bug_lines_point_at_the_buggy_code(split):
    _, expected = _load(split)
    for name, label in expected.items():
        assert isinstance(label["equivalent"], bool), f"{name}: equivalent must be true or false"
        assert label.get("description"), f"{name}: one-line description missing"
        if label["equivalent"]:
            assert "bug" not in label, f"{name}: an equivalent model has no bug line"
            continue
        path, line = label["bug"].rsplit(":", 1)
        lines = (REPO / path).read_text().splitlines()
        assert 1 <= int(line) <= len(lines), f"{name}: {label['bug']} is past the end of {path}"
        assert label["bug_code"] in lines[int(line) - 1], (
            f"{name}: line {label['bug']} is {lines[int(line) - 1]!r}, not the recorded bug_code")
        assert (REPO / path).resolve().is_relative_to(BLIND / split), f"{name}: bug outside the split"


@pytest.mark.slow
@pytest.mark.parametrize("split", SPLITS)
def test_oracle_confirms_every_label(split):
    proc = subprocess.run([sys.executable, str(BLIND / "oracle.py"), "--split", split, "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=1800,
                          check=False)
    verdicts = json.loads(proc.stdout)
    _, expected = _load(split)
    assert {v["name"] for v in verdicts} == set(expected)
    wrong = [f"{v['name']} ({'equivalent' if v['equivalent'] else 'buggy'}): rel diffs "
             f"{v['rel_per_seed']} tol {v['tol']} {v['note']}" for v in verdicts if not v["confirmed"]]
    assert not wrong, "labels the oracle contradicts:\n" + "\n".join(wrong)
    assert proc.returncode == 0
