"""Issue 15, item 2: shallow clones (actions/checkout's default depth 1) and unfetched PR bases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_github import FakeGitHub, actions_env, write_pr_event
from repos import equivci, git, make_repo


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> Path:
    """Two commits; the second only adds a README, so no model is affected by it."""
    repo = make_repo(tmp_path_factory.mktemp("origin") / "origin")
    (repo / "README.md").write_text("models\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "readme")
    return repo


def shallow_clone(origin: Path, dest: Path) -> Path:
    git(origin.parent, "clone", "-q", "--depth", "1", f"file://{origin}", str(dest))
    assert git(dest, "rev-parse", "--is-shallow-repository") == "true"
    return dest


def test_shallow_clone_is_deepened_for_changed_since(origin: Path, tmp_path: Path) -> None:
    clone = shallow_clone(origin, tmp_path / "clone")
    run = equivci(["verify", "--format", "json", "--changed-since", "HEAD~1"], clone)
    assert run.tracebacks == 0 and run.code == 0, run.stderr
    assert [m["status"] for m in json.loads(run.stdout)["models"]] == ["verified"]
    assert "git fetch" in run.stderr
    assert git(clone, "rev-parse", "HEAD~1")  # the history it needed is here now


def test_shallow_clone_without_remote_runs_everything_with_a_warning(origin: Path, tmp_path: Path) -> None:
    clone = shallow_clone(origin, tmp_path / "clone")
    git(clone, "remote", "remove", "origin")
    run = equivci(["verify", "--format", "json", "--changed-since", "HEAD~1"], clone)
    assert run.tracebacks == 0 and run.code == 0, run.stderr
    (model,) = json.loads(run.stdout)["models"]
    assert model["status"] == "verified" and model["reused"] is False
    assert "fetch-depth: 0" in run.stderr and "every selected model" in run.stderr


def test_unknown_ref_in_a_full_clone_is_a_usage_error_with_json(origin: Path, tmp_path: Path) -> None:
    run = equivci(["verify", "--format", "json", "--changed-since", "no-such-branch"], origin)
    assert run.tracebacks == 0 and run.code == 2
    doc = json.loads(run.stdout)
    assert doc["models"] == [] and "no-such-branch" in doc["error"] and "fetch-depth: 0" in doc["error"]


def test_ci_fetches_an_unfetched_pull_request_base(origin: Path, tmp_path: Path) -> None:
    base = git(origin, "rev-parse", "HEAD~1")
    head = git(origin, "rev-parse", "HEAD")
    clone = shallow_clone(origin, tmp_path / "clone")
    with FakeGitHub() as fake:
        event = write_pr_event(tmp_path / "event.json", fake.repo, 7, base, head)
        run = equivci(["ci"], clone, actions_env(tmp_path, fake, event))
    assert run.tracebacks == 0 and run.code == 0, run.stdout + run.stderr
    assert "git fetch" in run.stderr  # the base was fetched, not guessed
    assert "| mlp-tp | ✅ verified" in (tmp_path / "step_summary.md").read_text()
