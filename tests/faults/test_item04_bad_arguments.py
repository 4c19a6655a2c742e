"""Issue 15, item 4: output paths that are files, absurdly nested manifests, sys.exit() in the
model's code: one paragraph and exit code 2, never a traceback or a blank message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repos import MANIFEST, equivci, make_repo, model_entry, snapshot


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    exits = '''\
import sys

import jax.numpy as jnp


def at_trace(x, w1, w2):
    sys.exit(3)


def at_trace_no_code(x, w1, w2, *, mesh):
    raise SystemExit


def inputs_exit():
    exit("bye")
'''
    extra = (model_entry("exits-while-tracing", distributed="models/exits.py:at_trace")
             + model_entry("exits-bare", distributed="models/exits.py:at_trace_no_code")
             + model_entry("exits-in-inputs", inputs="models/exits.py:inputs_exit"))
    return make_repo(tmp_path_factory.mktemp("item4") / "repo", {"models/exits.py": exits}, MANIFEST + extra)


def test_report_dir_and_dump_out_naming_a_file(repo: Path) -> None:
    before = snapshot(repo)
    ci = equivci(["ci", "--report-dir", "models/mlp.py"], repo)
    dump = equivci(["dump", "--model", "mlp-tp", "--out", "models/mlp.py/sub"], repo)
    for run, option in ((ci, "--report-dir"), (dump, "--out")):
        assert run.tracebacks == 0 and run.code == 2
        assert f"{option} " in run.stderr and "is a file, not a folder" in run.stderr
    assert snapshot(repo) == before


@pytest.mark.parametrize("nesting", ["[" * 500 + "]" * 500, "{a: " * 500 + "1" + "}" * 500])
def test_manifest_nested_500_levels(tmp_path: Path, nesting: str) -> None:
    (tmp_path / "equivci.yaml").write_text(f"version: 1\nmodels: {nesting}\n")
    run = equivci(["verify", "--format", "json"], tmp_path)
    assert run.tracebacks == 0 and run.code == 2
    assert "nested too deeply" in json.loads(run.stdout)["error"]


@pytest.mark.parametrize(("model", "said"), [
    ("exits-while-tracing", "sys.exit(3) at "),
    ("exits-bare", "sys.exit(None) at "),
    ("exits-in-inputs", "sys.exit('bye') at "),
])
def test_sys_exit_in_the_models_code(repo: Path, model: str, said: str) -> None:
    run = equivci(["verify", "--format", "json", "--model", model], repo)
    assert run.tracebacks == 0 and run.code == 2, run.stderr
    (result,) = json.loads(run.stdout)["models"]
    message = result["findings"][0]["message"]
    assert result["status"] == "error" and said in message and "models/exits.py" in message
