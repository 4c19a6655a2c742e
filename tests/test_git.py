"""equivci.git on real temporary git repositories: changed files and lines since a ref."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from equivci import git as gitmod
from equivci.errors import EquivciError
from equivci.results import Finding, ModelResult, Status


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "models" / "a.py").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    (repo / "models" / "b.py").write_text("b\n")
    (repo / "models" / "old.py").write_text("".join(f"old {i}\n" for i in range(1, 21)))
    (repo / "equivci.yaml").write_text("version: 1\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "tag", "base")
    return repo


def test_committed_staged_unstaged_untracked_and_renamed(repo: Path) -> None:
    a = repo / "models" / "a.py"
    lines = a.read_text().splitlines(keepends=True)
    lines[2] = "line 3 changed\n"
    a.write_text("".join(lines))
    git(repo, "commit", "-qam", "edit a")  # committed
    lines[6] = "line 7 changed\n"
    a.write_text("".join(lines))
    git(repo, "add", "models/a.py")  # staged
    lines.insert(9, "new line 10\n")
    a.write_text("".join(lines))  # unstaged
    git(repo, "mv", "models/old.py", "models/new.py")
    (repo / "models" / "c.py").write_text("x\ny\n")  # untracked
    (repo / ".equivci" / "cache").mkdir(parents=True)
    (repo / ".equivci" / "cache" / "CACHEDIR.TAG").write_text("tag\n")

    changes = gitmod.changes_since(repo, "base")
    assert changes.files == {"models/a.py", "models/old.py", "models/new.py", "models/c.py"}
    assert changes.lines["models/a.py"] == {3, 7, 10}
    assert changes.lines["models/c.py"] == {1, 2}
    assert not changes.lines.get("models/new.py")  # a pure rename adds no line
    assert changes.changed_line("models/a.py", 7) and not changes.changed_line("models/a.py", 8)
    assert not changes.changed_line(None, 3) and not changes.changed_line("models/a.py", None)


def test_nothing_changed(repo: Path) -> None:
    changes = gitmod.changes_since(repo, "HEAD")
    assert changes.files == frozenset() and not changes.touches(["models/a.py", "equivci.yaml"])


def test_unknown_ref_and_no_repository(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(EquivciError, match="does not know this revision"):
        gitmod.changes_since(repo, "no-such-branch")
    outside = tmp_path / "plain"
    outside.mkdir()
    with pytest.raises(EquivciError, match="needs a git repository"):
        gitmod.changes_since(outside, "HEAD")


def test_affected_models_and_changed_findings(repo: Path) -> None:
    (repo / "models" / "b.py").write_text("b changed\n")
    changes = gitmod.changes_since(repo, "HEAD")
    assert not changes.touches(gitmod.model_files({"models/a.py"}, [], "equivci.yaml"))
    assert changes.touches(gitmod.model_files({"models/a.py"}, ["models/b.py"], "equivci.yaml"))  # b.py recorded
    result = ModelResult("uses-b", Status.MISMATCH, 1.0, findings=(
        Finding("models/b.py", 1, "error", None, "here"),
        Finding("models/a.py", 1, "error", None, "not changed"),
    ))
    marked = gitmod.mark_changed(result, changes)
    assert [f.changed for f in marked.findings] == [True, False]
    assert gitmod.mark_changed(result, None) is result
