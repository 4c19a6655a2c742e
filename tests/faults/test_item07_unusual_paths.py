"""Issue 15, item 7: paths with spaces and non-ASCII characters, from git to SARIF and GitHub."""

from __future__ import annotations

import json
from pathlib import Path

from fake_github import (
    MLP_TP,
    NO_PSUM_LINE,
    PSUM_LINE,
    FakeGitHub,
    actions_env,
    pull_files_from_git,
    write_pr_event,
)
from repos import MANIFEST, equivci, git, make_repo

from equivci import git as gitmod

ODD = "models/tp ü.py"
ODD_MANIFEST = MANIFEST.replace("models/mlp_tp.py:mlp", f"'{ODD}:mlp'")
BUG_LINE = MLP_TP.splitlines().index(PSUM_LINE) + 1


def test_git_names_come_out_as_on_disk(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {ODD: MLP_TP, 'models/q"uote\tab.py': "x = 1\n"}, ODD_MANIFEST)
    base = git(repo, "rev-parse", "HEAD")
    (repo / ODD).write_text(MLP_TP.replace(PSUM_LINE, NO_PSUM_LINE))
    (repo / 'models/q"uote\tab.py').write_text("x = 2\n")
    (repo / "models" / "neu ö.py").write_text("a\nb\n")  # untracked
    changes = gitmod.changes_since(repo, "HEAD")
    assert changes.files == {ODD, 'models/q"uote\tab.py', "models/neu ö.py"}
    assert changes.lines[ODD] == {BUG_LINE} and changes.lines["models/neu ö.py"] == {1, 2}
    git(repo, "commit", "-qam", "drop the psum")
    diff = gitmod.pr_diff_lines(repo, base, git(repo, "rev-parse", "HEAD"))
    assert diff.changed(ODD, BUG_LINE) and diff.in_diff('models/q"uote\tab.py', 1)


def test_finding_in_an_odd_file_reaches_sarif_and_the_review(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {ODD: MLP_TP}, ODD_MANIFEST)
    base = git(repo, "rev-parse", "HEAD")
    (repo / ODD).write_text(MLP_TP.replace(PSUM_LINE, NO_PSUM_LINE))
    git(repo, "commit", "-qam", "drop the psum")
    head = git(repo, "rev-parse", "HEAD")

    run = equivci(["verify", "--format", "sarif"], repo)
    assert run.code == 1 and run.tracebacks == 0, run.stderr
    (sarif_run,) = json.loads(run.stdout)["runs"]
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in sarif_run["results"]}
    assert "models/tp%20%C3%BC.py" in uris and not any(" " in u for u in uris)

    with FakeGitHub() as fake:
        fake.set_pull_files(3, pull_files_from_git(repo, base, head))
        event = write_pr_event(tmp_path / "event.json", fake.repo, 3, base, head)
        ci = equivci(["ci"], repo, actions_env(tmp_path, fake, event))
        lines = {(c["path"], c["line"]) for c in fake.review_comments.get(3, [])}
    assert ci.code == 1 and ci.tracebacks == 0, ci.stderr
    assert lines == {(ODD, BUG_LINE)}
    assert f"file={ODD},line={BUG_LINE}," in ci.stdout
    assert "tp%20%C3%BC.py#L" in (tmp_path / "step_summary.md").read_text()
