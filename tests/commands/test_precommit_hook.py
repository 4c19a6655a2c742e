"""The pre-commit hook: its definition, model selection by file, and a real `pre-commit try-repo` run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_github import MLP_TP, NO_PSUM_LINE, PSUM_LINE, make_pr_repo

from equivci.commands.precommit import affected_models, entrypoint_file, finding_lines
from equivci.manifest import load_manifest
from equivci.results import Finding, ModelResult, Report, Status

ROOT = Path(__file__).resolve().parents[2]


def test_hook_definition():
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "equivci"
    assert hook["entry"] == "equivci precommit"
    assert hook["language"] == "python"
    assert hook["require_serial"] is True
    assert hook.get("pass_filenames", True) is True
    assert set(hook["types_or"]) == {"python", "yaml"}


def test_selects_models_by_entrypoint_files_and_manifest(tmp_path, monkeypatch):
    pr = make_pr_repo(tmp_path)
    # a third model in package.module:FUNC form
    pkg = pr.path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tp.py").write_text(MLP_TP)
    manifest_text = (pr.path / "equivci.yaml").read_text() + (
        "  - name: mod\n    reference: models/mlp.py:mlp\n    distributed: pkg.tp:mlp\n"
        "    inputs: models/mlp.py:inputs\n    mesh: {tp: 2}\n"
    )
    (pr.path / "equivci.yaml").write_text(manifest_text)
    monkeypatch.chdir(pr.path)
    manifest = load_manifest(Path("equivci.yaml"))

    def names(*files: str) -> list[str]:
        return [m.name for m in affected_models(manifest, manifest.models, [Path(f) for f in files])]

    assert names(".gitignore") == []
    assert names("models/mlp_tp_edited.py") == ["mlp-tp-edited"]
    assert names("models/mlp.py") == ["mlp-tp", "mlp-tp-edited", "mod"]  # reference and inputs file
    assert names("pkg/tp.py") == ["mod"]
    assert names("equivci.yaml") == ["mlp-tp", "mlp-tp-edited", "mod"]
    assert entrypoint_file(manifest.models[2].distributed, manifest.root) == (pkg / "tp.py").resolve()


def test_finding_lines_are_path_line_message():
    report = Report(
        models=(
            ModelResult("a", Status.MISMATCH, 1.0, findings=(Finding("m/x.py", 3, "error", None, "psum missing\nhint"),)),
            ModelResult("b", Status.ERROR, 1.0, findings=(Finding(None, None, "error", None, "cannot import"),)),
            ModelResult("c", Status.UNPROVEN, 1.0),
            ModelResult("d", Status.VERIFIED, 1.0),
        )
    )
    assert finding_lines(report, "equivci.yaml") == [
        "m/x.py:3: psum missing hint [a: mismatch]",
        "equivci.yaml: cannot import [b: error]",
        "equivci.yaml: model c is unproven",
    ]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _hook_repo(tmp: Path) -> Path:
    """This checkout's package and hook definition, committed in a repository of their own."""
    repo = tmp / "hook-repo"
    repo.mkdir()
    for name in ("pyproject.toml", ".pre-commit-hooks.yaml"):
        shutil.copy(ROOT / name, repo / name)
    readme = ROOT / "README.md"
    (repo / "README.md").write_text(readme.read_text() if readme.exists() else "equivci\n")
    shutil.copytree(ROOT / "equivci", repo / "equivci", ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "add", ".")
    _git(repo, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-q", "-m", "hook")
    return repo


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_pre_commit_try_repo_on_clean_and_buggy_staged_changes(tmp_path):
    pytest.importorskip("pre_commit")
    hook_repo = _hook_repo(tmp_path)
    project = make_pr_repo(tmp_path, buggy=False).path
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PRE_COMMIT"))}
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")

    def try_repo() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "equivci", "--verbose"],
            cwd=project, env=env, capture_output=True, text=True, timeout=1800,
        )

    target = project / "models" / "mlp_tp.py"
    # clean staged change: a comment on the psum line
    target.write_text(MLP_TP.replace(PSUM_LINE, PSUM_LINE + "  # all-reduce the partial sums"))
    _git(project, "add", "models/mlp_tp.py")
    clean = try_repo()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "equivci" in clean.stdout and "Passed" in clean.stdout

    # buggy staged change: the psum is dropped
    target.write_text(MLP_TP.replace(PSUM_LINE, NO_PSUM_LINE))
    _git(project, "add", "models/mlp_tp.py")
    buggy = try_repo()
    assert buggy.returncode == 1, buggy.stdout + buggy.stderr
    assert "Failed" in buggy.stdout
    bug_line = MLP_TP.splitlines().index(PSUM_LINE) + 1
    assert f"models/mlp_tp.py:{bug_line}: " in buggy.stdout
    assert "[mlp-tp: mismatch]" in buggy.stdout
