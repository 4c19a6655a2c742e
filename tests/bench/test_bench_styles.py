"""The benchmark's implementation styles (bench/styles/) are honest: each distributed program
computes its reference's function, run for real at a tiny size on a fake mesh
(bench/check_styles.py), and the check catches a style that does not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def check(bench: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(bench / "check_styles.py"), *args], capture_output=True, text=True,
                          check=False, timeout=600)


@pytest.mark.slow  # about a minute: seven styles, each compiled twice (run it after editing bench/)
def test_every_style_equals_its_reference():
    proc = check(ROOT / "bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 7 and all(line.endswith(" ok") for line in lines), proc.stdout


def test_the_check_catches_a_missing_all_reduce(tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(ROOT / "bench", bench, ignore=shutil.ignore_patterns("__pycache__"))
    moe = bench / "styles" / "moe_ep.py"
    text = moe.read_text()
    line = "    return x + reduce(experts(h, combine"
    assert text.count(line) == 1
    moe.write_text(text.replace(line, "    return x + (experts(h, combine"))  # each device adds only its experts
    proc = check(bench, "--styles", "moe_ep")
    assert proc.returncode == 1 and "DIFFERENT" in proc.stdout, proc.stdout + proc.stderr
