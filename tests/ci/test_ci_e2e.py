"""End to end: the real `equivci ci` and `equivci precommit` CLIs, the real verifier, a real git
repository whose pull request drops the psum of a tensor-parallel MLP, and a local stand-in for the
GitHub API."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_github import FakeGitHub, actions_env, make_pr_repo, pull_files_from_git, read_outputs, write_pr_event

from equivci.ci.publish import MARKER

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("equivci.verify.engine") is None,
    reason="the verifier (equivci.verify.engine) is not available yet",
)

PR = 5


def cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "equivci", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """One PR run, then a rerun, against the same stand-in server."""
    tmp = tmp_path_factory.mktemp("e2e")
    pr = make_pr_repo(tmp)
    with FakeGitHub() as fake:
        fake.set_pull_files(PR, pull_files_from_git(pr.path, pr.base, pr.head))
        event = write_pr_event(tmp / "event.json", fake.repo, PR, pr.base, pr.head)
        env = actions_env(tmp, fake, event)
        first = cli(["ci", "--manifest", "equivci.yaml"], pr.path, env)
        summary_after_first = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
        outputs_after_first = read_outputs(Path(env["GITHUB_OUTPUT"]))
        comments_after_first = [dict(c) for c in fake.issue_comments.get(PR, [])]
        n_requests_first = len(fake.requests)
        second = cli(["ci", "--manifest", "equivci.yaml"], pr.path, env)
        yield {
            "pr": pr, "fake": fake, "env": env, "first": first, "second": second,
            "summary": summary_after_first, "outputs": outputs_after_first,
            "comments_after_first": comments_after_first, "rerun_requests": fake.requests[n_requests_first:],
        }


def test_first_run_comments_reviews_annotates_and_fails(scenario):
    pr, fake, first = scenario["pr"], scenario["fake"], scenario["first"]
    assert first.returncode == 1, first.stdout + first.stderr
    (comment,) = scenario["comments_after_first"]
    assert comment["body"].startswith(MARKER)
    assert "| mlp-tp | ✅ verified |" in comment["body"]
    assert "| mlp-tp-edited | ❌ mismatch |" in comment["body"]

    # the review's line comments sit on the line that lost its psum
    lines = {(c["path"], c["line"]) for c in fake.review_comments[PR]}
    assert lines == {(pr.edited, pr.bug_line)}
    assert "psum" in fake.review_comments[PR][0]["body"]

    annotations = [line for line in first.stdout.splitlines() if line.startswith("::")]
    assert annotations and annotations[0].startswith(f"::error file={pr.edited},line={pr.bug_line},title=equivci%3A mlp-tp-edited is mismatch::")
    assert fake.token not in first.stdout + first.stderr

    assert "| mlp-tp-edited | ❌ mismatch |" in scenario["summary"]
    out = scenario["outputs"]
    assert (out["status"], out["verified"], out["mismatch"]) == ("mismatch", "1", "1")
    sarif = json.loads(Path(out["sarif"]).read_text())
    located = {(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in sarif["runs"][0]["results"]}
    assert (pr.edited, pr.bug_line) in located


def test_rerun_edits_the_same_comment(scenario):
    fake, second = scenario["fake"], scenario["second"]
    assert second.returncode == 1
    assert len(fake.issue_comments[PR]) == 1
    assert fake.issue_comments[PR][0]["id"] == scenario["comments_after_first"][0]["id"]
    writes = [(r.method, r.path) for r in scenario["rerun_requests"] if r.method != "GET"]
    assert writes == [("PATCH", f"/repos/{fake.repo}/issues/comments/{fake.issue_comments[PR][0]['id']}")]
    assert len(fake.reviews[PR]) == 1


def test_read_only_token_from_a_fork(scenario, tmp_path):
    # The scenario's repository: its cache holds the verdict, so this run checks the publishing only
    # (the scenario's first run is the one that verifies afresh).
    pr = scenario["pr"]
    with FakeGitHub() as fake:
        fake.read_only = True
        fake.set_pull_files(PR, pull_files_from_git(pr.path, pr.base, pr.head))
        event = write_pr_event(tmp_path / "event.json", fake.repo, PR, pr.base, pr.head, head_repo="fork/widgets")
        env = actions_env(tmp_path, fake, event)
        proc = cli(["ci", "--manifest", "equivci.yaml", "--model", "mlp-tp-edited"], pr.path, env)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert fake.issue_comments.get(PR, []) == [] and fake.reviews.get(PR, []) == []
        assert f"::error file={pr.edited},line={pr.bug_line}," in proc.stdout
        assert "::warning title=equivci::The GitHub token cannot write to this pull request" in proc.stdout
        summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
        assert "❌ mismatch" in summary and "annotations and the job summary only" in summary


def test_precommit_command_selects_models_by_file(scenario):
    pr = scenario["pr"]  # its cache holds the verdicts: this checks the selection and the output
    env: dict[str, str] = {}
    # an unrelated file: nothing to verify
    unrelated = cli(["precommit", ".gitignore"], pr.path, env)
    assert unrelated.returncode == 0 and unrelated.stdout == ""
    # the buggy file: only its model runs, and the finding is printed as path:line: message
    buggy = cli(["precommit", pr.edited], pr.path, env)
    assert buggy.returncode == 1, buggy.stderr
    first = buggy.stdout.splitlines()[0]
    assert first.startswith(f"{pr.edited}:{pr.bug_line}: ") and first.endswith("[mlp-tp-edited: mismatch]")
    assert "mlp-tp-edited" in buggy.stderr and "[1/1]" in buggy.stderr
