"""Issue 15, item 3: an output channel GitHub Actions gives that cannot be written is a warning."""

from __future__ import annotations

from pathlib import Path

from fake_github import FakeGitHub, actions_env
from repos import equivci, make_repo, snapshot


def test_unwritable_summary_output_and_report_dir_leave_a_verified_run_green(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    before = snapshot(repo)
    with FakeGitHub() as fake:
        env = actions_env(tmp_path, fake, None, event_name="push")
    # Failures that hold for root too: opening a folder, a missing folder, a file that refuses
    # writes, a file system that refuses folders.
    env["GITHUB_STEP_SUMMARY"] = str(tmp_path)
    env["GITHUB_OUTPUT"] = str(tmp_path / "missing" / "deeper" / "output")
    run = equivci(["ci", "--report-dir", "/sys/equivci-report"], repo, env)
    env["GITHUB_STEP_SUMMARY"] = "/proc/version"
    again = equivci(["ci"], repo, env)
    assert again.tracebacks == 0 and again.code == 0 and "cannot write GITHUB_STEP_SUMMARY=/proc/version" in again.stderr
    assert run.tracebacks == 0
    assert run.code == 0, run.stdout + run.stderr
    assert "mlp-tp" in run.stdout and "verified" in run.stdout
    for what in ("GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT", "report files"):
        assert f"warning: cannot write {'the ' if what == 'report files' else ''}{what}" in run.stderr
    assert snapshot(repo) == before
