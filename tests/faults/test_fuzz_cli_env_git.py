"""Fault suite: command-line misuse, environment variables and git states, on a committed
repository whose cache already holds the verdict (so most cases cost no capture). Every case runs
the CLI in this process: exit codes per the contract, no traceback, the user's files untouched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fake_github import GITHUB_VARS, FakeGitHub, actions_env, write_pr_event
from repos import TRACEBACK, git, make_repo, snapshot

import equivci.commands.ci as ci_command
from equivci.cli import run
from equivci.results import ModelResult, Report, Status


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    repo = make_repo(tmp_path_factory.mktemp("warm") / "repo", {"README.md": "readme\n"})
    git(repo, "tag", "v1")
    assert run(["verify", "--manifest", str(repo / "equivci.yaml")]) == 0
    return repo


@pytest.fixture
def repo(warm: Path, tmp_path: Path, monkeypatch) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(warm, copy, symlinks=True)
    for var in (*GITHUB_VARS, "EQUIVCI_CACHE_DIR", "EQUIVCI_VERIFY_TIMEOUT", "EQUIVCI_VERIFY_MEMORY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(copy)
    return copy


def cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(list(args))
    out, err = capsys.readouterr()
    assert TRACEBACK not in out + err
    return code, out, err


def verify_json(capsys, *args: str) -> tuple[int, dict, str]:
    code, out, err = cli(capsys, "verify", "--format", "json", *args)
    return code, json.loads(out), err


# --- command-line misuse --------------------------------------------------------------------------

USAGE = [
    (["verify", "--format", "xml"], "Invalid value"),
    (["verify", "--bogus"], "No such option"),
    (["verify", "--capture-timeout", "0"], "--capture-timeout"),
    (["verify", "--capture-timeout", "soon"], "--capture-timeout"),
    (["dump"], "Missing option"),
    (["dump", "--model", "nope", "--out", "out"], "no model named 'nope'"),
    (["verify", "--model", "nope"], "no model named 'nope'"),
    (["verify", "--tag", "nope"], "no model is tagged 'nope'"),
    (["verify", "--manifest", "models"], "not a file"),
    (["verify", "--manifest", "missing.yaml"], "manifest not found"),
    (["ci", "--report-dir", "README.md"], "is a file, not a folder"),
    (["dump", "--model", "mlp-tp", "--out", "README.md/x"], "is a file, not a folder"),
    (["verify", "--changed-since", "no-such-ref"], "does not know this revision"),
    (["verify", "--changed-since", "HEAD~5"], "does not know this revision"),
    (["verify", "--changed-since=--output=pwned"], "does not know this revision"),
    (["verify", "--changed-since", "HEAD:README.md"], "does not know this revision"),
    (["nonsense-command"], "No such command"),
    (["precommit", "--bogus"], "No such option"),
]


@pytest.mark.parametrize(("args", "phrase"), USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors(repo: Path, capsys, args: list[str], phrase: str) -> None:
    before = snapshot(repo)
    code, out, err = cli(capsys, *args)
    assert code == 2 and phrase in out + err
    assert snapshot(repo) == before and not (repo / "pwned").exists() and not (repo / "out").exists()


def test_manifest_fifo_does_not_hang(repo: Path, capsys) -> None:
    os.mkfifo(repo / "fifo.yaml")
    code, _, err = cli(capsys, "verify", "--manifest", "fifo.yaml")
    assert code == 2 and "not a file" in err


def test_precommit_with_unknown_files_and_version(repo: Path, capsys) -> None:
    assert cli(capsys, "precommit", "no/such/file.py")[0] == 0
    assert cli(capsys, "--version")[0] == 0


# --- git states -----------------------------------------------------------------------------------


def _conflict(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "README.md").write_text("theirs\n")
    git(repo, "commit", "-qam", "theirs")
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("ours\n")
    git(repo, "commit", "-qam", "ours")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "merge", "-q", "other"],
                   cwd=repo, capture_output=True, check=False)  # the conflict is the point
    assert "<<<<<<<" in (repo / "README.md").read_text()


GIT_STATES = {
    "clean": lambda repo: None,
    "detached-head": lambda repo: git(repo, "checkout", "-q", "--detach"),
    "untracked-unrelated": lambda repo: (repo / "notes.txt").write_text("x\n"),
    "staged-unrelated": lambda repo: ((repo / "README.md").write_text("y\n"), git(repo, "add", "README.md")),
    "merge-conflict-unrelated": _conflict,
    "index-lock": lambda repo: (repo / ".git" / "index.lock").write_text(""),
    "diff-external": lambda repo: git(repo, "config", "diff.external", "/bin/false"),
    "color-always": lambda repo: git(repo, "config", "color.diff", "always"),
    "noprefix": lambda repo: git(repo, "config", "diff.noprefix", "true"),
    "mnemonic-prefix": lambda repo: git(repo, "config", "diff.mnemonicPrefix", "true"),
    "quotepath": lambda repo: git(repo, "config", "core.quotepath", "true"),
    "untracked-hidden": lambda repo: git(repo, "config", "status.showUntrackedFiles", "no"),
}


@pytest.mark.parametrize("state", list(GIT_STATES))
def test_git_states_reuse_unaffected_models(repo: Path, capsys, state: str) -> None:
    GIT_STATES[state](repo)
    code, doc, err = verify_json(capsys, "--changed-since", "v1" if state == "merge-conflict-unrelated" else "HEAD")
    assert code == 0, err
    assert [(m["status"], m["reused"]) for m in doc["models"]] == [("verified", True)]


@pytest.mark.parametrize("state", ["diff-external", "color-always", "noprefix", "mnemonic-prefix", "quotepath"])
def test_git_configuration_does_not_change_the_changed_lines(repo: Path, state: str) -> None:
    from equivci import git as gitmod

    GIT_STATES[state](repo)
    text = (repo / "models" / "mlp_tp.py").read_text().splitlines(keepends=True)
    text[3] = text[3].rstrip("\n") + "  # edited\n"
    (repo / "models" / "mlp_tp.py").write_text("".join(text))
    changes = gitmod.changes_since(repo, "HEAD")
    assert changes.files == {"models/mlp_tp.py"} and changes.lines == {"models/mlp_tp.py": {4}}


BROKEN_GIT = {
    "not-a-repository": lambda repo: shutil.rmtree(repo / ".git"),
    "gitfile-to-nowhere": lambda repo: (shutil.rmtree(repo / ".git"), (repo / ".git").write_text("gitdir: /nonexistent\n")),
    "corrupt-head": lambda repo: (repo / ".git" / "HEAD").write_text("garbage\n"),
    "no-commits": lambda repo: (shutil.rmtree(repo / ".git"), git(repo, "init", "-q")),
    "objects-gone": lambda repo: shutil.rmtree(repo / ".git" / "objects"),
}


@pytest.mark.parametrize("state", list(BROKEN_GIT))
@pytest.mark.parametrize("output", ["text", "json"])
def test_broken_git_is_a_usage_error(repo: Path, capsys, state: str, output: str) -> None:
    BROKEN_GIT[state](repo)
    before = snapshot(repo)
    code, out, err = cli(capsys, "verify", "--format", output, "--changed-since", "HEAD")
    assert code == 2 and "--changed-since HEAD" in err and err.count("equivci: error:") == 1
    if output == "json":
        assert json.loads(out)["models"] == []
    assert snapshot(repo) == before


# --- environment variables ------------------------------------------------------------------------

BAD_ENV = [
    ("EQUIVCI_VERIFY_TIMEOUT", "abc"), ("EQUIVCI_VERIFY_TIMEOUT", "-1"), ("EQUIVCI_VERIFY_TIMEOUT", "inf"),
    ("EQUIVCI_VERIFY_TIMEOUT", "nan"), ("EQUIVCI_VERIFY_MEMORY", "1.5"), ("EQUIVCI_VERIFY_MEMORY", "8GB"),
    ("EQUIVCI_VERIFY_MEMORY", "-4"),
]


@pytest.mark.parametrize(("name", "value"), BAD_ENV, ids=[f"{n}={v}" for n, v in BAD_ENV])
def test_bad_numeric_environment(repo: Path, capsys, monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    code, _, err = cli(capsys, "verify")
    assert code == 2 and f"{name}={value!r} is not valid" in err


HARMLESS_ENV = {
    "TMPDIR": "/nonexistent/tmp", "HOME": "/nonexistent/home", "LC_ALL": "C", "JAX_PLATFORMS": "cuda",
    "EQUIVCI_VERIFY_TIMEOUT": "30", "PYTHONIOENCODING": "ascii:backslashreplace", "COLUMNS": "5",
}


@pytest.mark.parametrize(("name", "value"), HARMLESS_ENV.items(), ids=list(HARMLESS_ENV))
def test_harmless_environment(repo: Path, capsys, monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    code, doc, err = verify_json(capsys)
    assert code == 0, err
    assert [m["status"] for m in doc["models"]] == ["verified"]


# --- the GitHub Actions environment (the pipeline replaced by a verified report) -------------------


@pytest.fixture
def actions(repo: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(ci_command, "run_pipeline", lambda *a, **k: Report(models=(ModelResult("mlp-tp", Status.VERIFIED, 1.0),)))
    with FakeGitHub() as fake:
        base, head = git(repo, "rev-parse", "HEAD~0"), git(repo, "rev-parse", "HEAD")
        event = write_pr_event(tmp_path / "event.json", fake.repo, 4, base, head)
        env = actions_env(tmp_path, fake, event)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        yield fake, env, tmp_path


BAD_EVENTS = {
    "missing-file": lambda tmp: str(tmp / "nope.json"),
    "a-folder": lambda tmp: str(tmp),
    "not-json": lambda tmp: (tmp / "e.json").write_text("{") and str(tmp / "e.json"),
    "a-list": lambda tmp: (tmp / "e.json").write_text("[]") and str(tmp / "e.json"),
    "no-base": lambda tmp: (tmp / "e.json").write_text(json.dumps({"pull_request": {"number": 1, "head": {"sha": "a"}}})) and str(tmp / "e.json"),
    "number-not-int": lambda tmp: (tmp / "e.json").write_text(json.dumps({"pull_request": {"number": "x", "base": {"sha": "a"}, "head": {"sha": "b"}}})) and str(tmp / "e.json"),
    "binary": lambda tmp: (tmp / "e.json").write_bytes(b"\xff\xfe\x00") and str(tmp / "e.json"),
}


@pytest.mark.parametrize("case", list(BAD_EVENTS))
def test_bad_event_file(actions, capsys, monkeypatch, case: str) -> None:
    _, _, tmp = actions
    monkeypatch.setenv("GITHUB_EVENT_PATH", BAD_EVENTS[case](tmp))
    code, _, err = cli(capsys, "ci")
    assert code == 2 and ("GITHUB_EVENT_PATH" in err or "pull_request event payload" in err)


CHANNELS = {
    "summary-is-a-folder": {"GITHUB_STEP_SUMMARY": "{tmp}"},
    "summary-refuses-writes": {"GITHUB_STEP_SUMMARY": "/proc/version"},
    "output-in-missing-folder": {"GITHUB_OUTPUT": "{tmp}/no/such/output"},
    "runner-temp-is-a-file": {"RUNNER_TEMP": "{tmp}/event.json"},
    "api-url-not-a-url": {"GITHUB_API_URL": "not a url"},
    "api-url-not-http": {"GITHUB_API_URL": "file:///etc"},
    "wrong-token": {"GITHUB_TOKEN": "ghs_wrong"},
    "no-token": {"GITHUB_TOKEN": ""},
    "no-repository": {"GITHUB_REPOSITORY": ""},
    "event-without-path": {"GITHUB_EVENT_PATH": ""},
    "push-event": {"GITHUB_EVENT_NAME": "push"},
}


@pytest.mark.parametrize("case", list(CHANNELS))
def test_failing_channels_never_change_a_verified_verdict(actions, repo: Path, capsys, monkeypatch, case: str) -> None:
    _, _, tmp = actions
    for name, value in CHANNELS[case].items():
        monkeypatch.setenv(name, value.format(tmp=tmp))
    before = snapshot(repo)
    code, out, err = cli(capsys, "ci")
    assert code == 0, out + err
    assert "mlp-tp  verified" in out
    assert snapshot(repo) == before


def test_read_only_token(actions, capsys) -> None:
    fake, _, tmp = actions
    fake.read_only = True
    code, _, _ = cli(capsys, "ci")
    assert code == 0 and "annotations and the job summary only" in (tmp / "step_summary.md").read_text()
