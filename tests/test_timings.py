"""`equivci verify --timings`: stage times on stderr, from real CLI processes (cold, then warm)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from equivci.timings import HEADER, ROW, Laps, read, write

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
MANIFEST = """\
version: 1
models:
  - name: mlp-tp
    reference: models/mlp.py:mlp
    distributed: models/mlp_tp.py:mlp
    inputs: models/mlp.py:mlp_inputs
    mesh: {tp: 2}
"""


def test_laps_add_up_and_parts_nest_under_their_stage() -> None:
    laps = Laps()
    time.sleep(0.01)
    laps.lap("first")
    time.sleep(0.02)
    laps.lap("child", [("a", 0.005), ("a/detail", 0.004), ("b", 0.006)])
    stages = dict(laps.rows)
    assert list(stages) == ["first", "child", "child/a", "child/a/detail", "child/b", "child/other (process start and exit, transfer)"]
    assert stages["first"] >= 0.01 and stages["child"] >= 0.02
    # The rest is the stage less its top-level parts (a part's own parts are inside it).
    assert abs(stages["child/other (process start and exit, transfer)"] - (stages["child"] - 0.011)) < 1e-9
    out = io.StringIO()
    write(laps.rows, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "equivci: timings (wall seconds)"
    assert re.fullmatch(r"      detail +0\.004", lines[4])


def _verify(repo: Path, *args: str) -> tuple[dict, dict[str, float]]:
    env = {k: v for k, v in os.environ.items() if k != "EQUIVCI_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-m", "equivci", "verify", "--format", "json", "--timings", *args],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # the report alone on stdout
    block = proc.stderr[proc.stderr.index(HEADER):].splitlines()[1:]
    for line in block:
        assert ROW.fullmatch(line), line
    return doc, read(proc.stderr)


def test_timings_of_a_cold_and_a_warm_run(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    for name in ("mlp.py", "mlp_tp.py"):
        shutil.copy(EXAMPLES / name, repo / "models" / name)
    (repo / "equivci.yaml").write_text(MANIFEST)

    doc, cold = _verify(repo)
    assert doc["models"][0]["status"] == "verified"
    model = "models/mlp-tp"
    for stage in ("capture/import jax", "capture/lower reference", "capture/lower distributed",
                  "capture/content key", "capture/SPMD partitioning", "verify/import the verifier",
                  "verify/parse HLO", "verify/build programs", "memo: record"):
        assert f"{model}/{stage}" in cold, stage
    assert {"start-up (imports, arguments)", "report", "total"} <= set(cold)
    assert cold["total"] >= cold[model] >= cold[f"{model}/capture"] >= cold[f"{model}/capture/lower reference"]

    doc, warm = _verify(repo)
    assert doc["models"][0]["layers"]["reused"] == doc["models"][0]["layers"]["total"]
    assert f"{model}/capture/content key" in warm
    assert not any(stage.startswith((f"{model}/verify", f"{model}/capture/SPMD")) for stage in warm)


def test_the_benchmark_reads_the_table_back() -> None:
    """bench/run_bench.py breaks each run down by stage from this table: the two stay in step."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_bench", Path(__file__).resolve().parents[1] / "bench" / "run_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [("start-up (imports, arguments)", 0.25), ("models", 3.0), ("models/m", 2.9),
            ("models/m/capture", 2.0), ("models/m/capture/import jax", 0.5), ("models/m/capture/lower reference", 0.3),
            ("models/m/capture/lower distributed", 0.4), ("models/m/verify", 0.9),
            ("models/m/verify/prove layers (3 new, 30 reused)", 0.6), ("total", 3.3)]
    out = io.StringIO()
    write(rows, out)
    parsed = read("equivci: [1/1] m: verified (2.9 s)\n" + out.getvalue())
    assert parsed == dict(rows)
    columns = bench.stage_columns(parsed)
    assert [columns[c] for c in ("start-up", "jax", "lower", "layers")] == pytest.approx([0.25, 0.5, 0.7, 0.6])
