"""`equivci ci` against a real local stand-in for the GitHub API, a real git repository with base and
head commits and a synthetic pull_request event. The verifier is replaced by a constructed report
here (tests/ci/test_ci_e2e.py runs the real one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_github import (
    GITHUB_VARS,
    FakeGitHub,
    actions_env,
    make_pr_repo,
    pull_files_from_git,
    read_outputs,
    write_pr_event,
)

import equivci.commands.ci as ci_command
from equivci.ci.publish import MARKER
from equivci.cli import run
from equivci.results import Finding, ModelResult, Report, Status

PR = 17


@pytest.fixture
def pr(tmp_path):
    return make_pr_repo(tmp_path)


@pytest.fixture
def fake():
    with FakeGitHub() as server:
        yield server


def report_for(pr) -> Report:
    return Report(
        models=(
            ModelResult("mlp-tp", Status.VERIFIED, 1.0),
            ModelResult(
                "mlp-tp-edited",
                Status.MISMATCH,
                2.0,
                findings=(
                    Finding(pr.edited, pr.bug_line, "error", None, "partial sum returned: a psum over 'tp' is missing"),
                    Finding("models/mlp.py", 8, "error", None, "reference op consumed nowhere"),
                ),
            ),
        )
    )


@pytest.fixture
def setup(tmp_path, pr, fake, monkeypatch):
    calls = []

    def fake_pipeline(manifest, models, *, changed_since, no_cache, debug):
        calls.append({"models": [m.name for m in models], "changed_since": changed_since, "no_cache": no_cache})
        return report_for(pr)

    monkeypatch.setattr(ci_command, "run_pipeline", fake_pipeline)
    for var in GITHUB_VARS:
        monkeypatch.delenv(var, raising=False)
    event = write_pr_event(tmp_path / "event.json", fake.repo, PR, pr.base, pr.head)
    env = actions_env(tmp_path, fake, event)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(pr.path)
    fake.set_pull_files(PR, pull_files_from_git(pr.path, pr.base, pr.head))
    return env, calls


def run_ci(capsys, *args: str) -> tuple[int, str, str]:
    code = run(["ci", "--manifest", "equivci.yaml", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_pull_request_comment_review_annotations_summary_outputs(setup, fake, pr, capsys):
    env, calls = setup
    code, out, err = run_ci(capsys)
    assert code == 1
    assert calls == [{"models": ["mlp-tp", "mlp-tp-edited"], "changed_since": pr.base, "no_cache": False}]

    # one sticky comment with the marker; the out-of-diff finding is in it, the in-diff one is not
    (comment,) = fake.issue_comments[PR]
    assert comment["body"].startswith(MARKER)
    assert "models/mlp.py:8" in comment["body"] and "reference op consumed nowhere" in comment["body"]
    assert "psum over 'tp' is missing" not in comment["body"]
    assert "1 finding is shown as review comments" in comment["body"]

    # a review whose single line comment sits on the defective line
    (review,) = fake.reviews[PR]
    assert review["event"] == "COMMENT" and review["commit_id"] == pr.head
    (line_comment,) = fake.review_comments[PR]
    assert (line_comment["path"], line_comment["line"], line_comment["side"]) == (pr.edited, pr.bug_line, "RIGHT")
    assert "psum over 'tp' is missing" in line_comment["body"]

    # annotations, worst first, on stdout
    annotations = [line for line in out.splitlines() if line.startswith("::")]
    assert annotations[0] == (
        f"::error file={pr.edited},line={pr.bug_line},title=equivci%3A mlp-tp-edited is mismatch::"
        "partial sum returned: a psum over 'tp' is missing"
    )
    assert len(annotations) == 2

    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert "| mlp-tp-edited | ❌ mismatch |" in summary
    assert f"https://github.example/{fake.repo}/blob/{pr.head}/{pr.edited}#L{pr.bug_line}" in summary

    outputs = read_outputs(Path(env["GITHUB_OUTPUT"]))
    assert outputs["status"] == "mismatch" and outputs["verified"] == "1" and outputs["mismatch"] == "1"
    sarif = json.loads(Path(outputs["sarif"]).read_text())
    assert sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] == pr.bug_line
    assert Path(outputs["report-dir"]).parent == Path(env["RUNNER_TEMP"])
    assert fake.token not in out + err


def test_rerun_edits_the_comment_and_adds_no_duplicates(setup, fake, pr, capsys):
    run_ci(capsys)
    first_id = fake.issue_comments[PR][0]["id"]
    fake.requests.clear()
    code, _, err = run_ci(capsys)
    assert code == 1
    assert len(fake.issue_comments[PR]) == 1 and fake.issue_comments[PR][0]["id"] == first_id
    writes = [(r.method, r.path) for r in fake.writes()]
    assert writes == [("PATCH", f"/repos/{fake.repo}/issues/comments/{first_id}")]
    assert len(fake.reviews[PR]) == 1 and len(fake.review_comments[PR]) == 1
    assert "updated the summary comment" in err


def test_existing_comments_of_others_are_left_alone(setup, fake, capsys):
    fake.add_issue_comment(PR, "LGTM")
    run_ci(capsys)
    assert [c["body"] for c in fake.issue_comments[PR]][0] == "LGTM"
    assert len(fake.issue_comments[PR]) == 2


def test_read_only_token_falls_back_to_annotations_and_summary(setup, fake, pr, capsys):
    env, _ = setup
    fake.read_only = True
    code, out, _ = run_ci(capsys)
    assert code == 1
    assert fake.issue_comments.get(PR, []) == [] and fake.reviews.get(PR, []) == []
    assert all(r.method == "GET" for r in fake.requests[:-1])
    assert f"::error file={pr.edited},line={pr.bug_line}," in out
    assert "::warning title=equivci::The GitHub token cannot write to this pull request (HTTP 403" in out
    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert "| mlp-tp-edited | ❌ mismatch |" in summary
    assert "annotations and the job summary only" in summary


def test_no_token_falls_back_without_calling_the_api(setup, fake, monkeypatch, capsys):
    monkeypatch.delenv("GITHUB_TOKEN")
    code, out, _ = run_ci(capsys)
    assert code == 1 and fake.requests == []
    assert "No GitHub token" in out


def test_review_rejected_with_422_moves_every_finding_to_the_summary(setup, fake, pr, capsys):
    fake.set_pull_files(PR, [])  # GitHub's view of the diff disagrees: every line is "outside"
    code, _, err = run_ci(capsys)
    assert code == 1 and fake.reviews.get(PR, []) == []
    (comment,) = fake.issue_comments[PR]
    assert "psum over 'tp' is missing" in comment["body"] and "reference op consumed nowhere" in comment["body"]
    assert "GitHub refused the line comments" in comment["body"]
    assert "HTTP 422" in err


def test_diff_from_the_api_when_the_base_commit_is_missing(setup, fake, pr, tmp_path, monkeypatch, capsys):
    missing = "0" * 40
    write_pr_event(tmp_path / "event.json", fake.repo, PR, missing, pr.head)
    run_ci(capsys)
    assert any(r.path.endswith(f"/pulls/{PR}/files") for r in fake.requests)
    (line_comment,) = fake.review_comments[PR]
    assert line_comment["line"] == pr.bug_line


def test_transient_errors_are_retried(setup, fake, monkeypatch, capsys):
    monkeypatch.setattr("equivci.ci.github.time.sleep", lambda s: None)
    fake.inject(502, {"message": "Bad Gateway"}, method="POST", path_contains="/reviews")
    fake.inject(429, {"message": "slow"}, {"Retry-After": "0"}, method="GET", path_contains="/issues/")
    code, _, _ = run_ci(capsys)
    assert code == 1 and len(fake.reviews[PR]) == 1 and len(fake.issue_comments[PR]) == 1


def test_push_event_reports_without_a_pull_request(setup, fake, tmp_path, monkeypatch, capsys):
    env, calls = setup
    (tmp_path / "push.json").write_text(json.dumps({"ref": "refs/heads/main"}))
    monkeypatch.setenv("GITHUB_EVENT_NAME", "schedule")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(tmp_path / "push.json"))
    code, out, _ = run_ci(capsys, "--all", "--no-cache")
    assert code == 1 and fake.requests == []
    assert calls[-1]["changed_since"] is None and calls[-1]["no_cache"] is True
    assert "::error file=" in out
    assert read_outputs(Path(env["GITHUB_OUTPUT"]))["status"] == "mismatch"


def test_manifest_error_is_annotated_and_exits_2(setup, capsys):
    env, _ = setup
    code = run(["ci", "--manifest", "missing.yaml"])
    out = capsys.readouterr().out
    assert code == 2
    assert out.startswith("::error file=missing.yaml,title=equivci%3A manifest error::")
    assert read_outputs(Path(env["GITHUB_OUTPUT"]))["status"] == "error"


def test_pull_request_touching_no_model_creates_no_comment_but_updates_an_old_one(setup, fake, pr, monkeypatch, capsys):
    monkeypatch.setattr(ci_command, "run_pipeline", lambda *a, **k: Report(models=()))
    code, _, err = run_ci(capsys)
    assert code == 0 and fake.writes() == [] and "no summary comment" in err
    old = fake.add_issue_comment(PR, MARKER + "\nold failure", login="github-actions[bot]")
    code, _, _ = run_ci(capsys)
    assert code == 0 and len(fake.issue_comments[PR]) == 1
    assert "nothing to verify" in old["body"]
