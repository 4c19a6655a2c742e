"""Issue 15, item 9: GitHub's limits, against the stand-in server: annotations (10 per type per
step, 50 per job), the job summary (1 MiB) and comments (65536 characters), one SARIF run per
category, and line comments of an earlier run on lines that are now fixed."""

from __future__ import annotations

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
from equivci.ci import publish
from equivci.cli import run
from equivci.results import Finding, ModelResult, Report, Status

PR = 9


@pytest.fixture
def pr(tmp_path):
    return make_pr_repo(tmp_path)


@pytest.fixture
def github(tmp_path, pr, monkeypatch):
    """The Actions environment of a pull request against the stand-in server; `reports` is the
    list of reports the next runs' pipeline returns, in order."""
    reports: list[Report] = []
    monkeypatch.setattr(ci_command, "run_pipeline", lambda *a, **k: reports.pop(0))
    for var in GITHUB_VARS:
        monkeypatch.delenv(var, raising=False)
    with FakeGitHub() as fake:
        event = write_pr_event(tmp_path / "event.json", fake.repo, PR, pr.base, pr.head)
        for k, v in actions_env(tmp_path, fake, event).items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(pr.path)
        fake.set_pull_files(PR, pull_files_from_git(pr.path, pr.base, pr.head))
        yield fake, reports, tmp_path


def flood(n: int, width: int = 400) -> Report:
    """A model with n error, n warning and n note findings, each `width` characters long."""
    findings = tuple(
        Finding("models/mlp.py", 1 + i % 16, severity, None, f"{severity} {i}: " + "x" * width)
        for severity in ("error", "warning", "note") for i in range(n)
    )
    return Report(models=(ModelResult("mlp-tp-edited", Status.MISMATCH, 1.0, findings=findings),))


def ci(capsys) -> tuple[int, str]:
    code = run(["ci", "--manifest", "equivci.yaml"])
    return code, capsys.readouterr().out


def test_annotations_worst_first_within_limits_then_a_notice(github, capsys):
    _, reports, _ = github
    reports.append(flood(30, width=20))
    code, out = ci(capsys)
    assert code == 1
    commands = [line for line in out.splitlines() if line.startswith("::") and "title=equivci" in line]
    kinds = [line.split(" ", 1)[0] for line in commands]
    assert kinds.count("::error") == 10 and kinds.count("::warning") == 10 and kinds.count("::notice") == 10
    assert commands[0].endswith("::error 0: " + "x" * 20)  # worst first, then program order
    assert commands[-1].startswith("::notice title=equivci::+61 more:") and "job summary" in commands[-1]


def test_fifty_per_job():
    lines, dropped = publish.annotations(flood(30, width=5), limit=30, job_limit=50)
    assert len(lines) == 50 and dropped == 90 - 49
    assert lines[-1].startswith("::notice title=equivci::+41 more")


def test_summary_and_comment_truncate_with_a_pointer(github, capsys):
    fake, reports, tmp = github
    reports.append(flood(1200, width=400))  # about 1.5 MB of findings
    code, _ = ci(capsys)
    assert code == 1
    summary = (tmp / "step_summary.md").read_bytes()
    assert len(summary) <= publish.SUMMARY_LIMIT and b"cut at GitHub's job summary size limit" in summary
    report_md = Path(read_outputs(tmp / "github_output.txt")["markdown"]).read_text()
    assert len(report_md.encode()) > publish.SUMMARY_LIMIT and report_md.encode()[:1000] == summary[:1000]
    (comment,) = fake.issue_comments[PR]
    assert len(comment["body"]) <= publish.COMMENT_LIMIT and comment["body"].startswith(publish.MARKER)
    assert "cut at GitHub's comment size limit" in comment["body"] and "workflow run" in comment["body"]


def test_sarif_one_run_per_category(tmp_path):
    from equivci.report import sarif

    report = flood(2, width=5)
    default = sarif.to_sarif(report, tmp_path, "equivci.yaml")
    nested = sarif.to_sarif(report, tmp_path, "services/llm/equivci.yaml")
    assert len(default["runs"]) == len(nested["runs"]) == 1
    assert default["runs"][0]["automationDetails"]["id"] == "equivci/"
    assert nested["runs"][0]["automationDetails"]["id"] == "equivci/services/llm/equivci.yaml/"


def test_line_comments_on_fixed_lines_are_marked_fixed(github, capsys, pr):
    fake, reports, _ = github
    bug = Finding(pr.edited, pr.bug_line, "error", None, "a psum over 'tp' is missing")
    other = Finding("models/mlp.py", 1, "error", None, "elsewhere")  # outside the diff: no line comment
    reports += [
        Report(models=(ModelResult("mlp-tp-edited", Status.MISMATCH, 1.0, findings=(bug, other)),)),
        Report(models=(ModelResult("mlp-tp-edited", Status.ERROR, 1.0, findings=(Finding(None, None, "error", None, "import failed"),)),)),
        Report(models=()),  # the model was not selected: nothing is known about it
        Report(models=(ModelResult("mlp-tp-edited", Status.VERIFIED, 1.0),)),
        Report(models=(ModelResult("mlp-tp-edited", Status.MISMATCH, 1.0, findings=(bug,)),)),
    ]
    assert ci(capsys)[0] == 1
    (posted,) = fake.review_comments[PR]
    assert publish.FIXED_MARKER not in posted["body"]

    ci(capsys)  # an error says nothing about the old finding
    ci(capsys)  # nor does a run that did not check the model
    assert publish.FIXED_MARKER not in fake.review_comments[PR][0]["body"]

    assert ci(capsys)[0] == 0
    body = fake.review_comments[PR][0]["body"]
    assert body.startswith("✅ **Fixed** at ") and publish.FIXED_MARKER in body and "a psum over 'tp' is missing" in body
    patches = [r for r in fake.requests if r.method == "PATCH" and "/pulls/comments/" in r.path]
    assert len(patches) == 1

    assert ci(capsys)[0] == 1  # the bug comes back: a new line comment
    assert len(fake.review_comments[PR]) == 2 and publish.FIXED_MARKER not in fake.review_comments[PR][1]["body"]
