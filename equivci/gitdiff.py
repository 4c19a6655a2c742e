"""`--changed-since REF`: which files and lines changed since a git ref (gitpython), and which models
that touches.

"Changed since REF" compares REF with the working tree, as the user sees it: committed, staged and
unstaged edits all count, and so do untracked files (every line of which is new). Paths are relative
to the repository root, as in findings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

from equivci.errors import EquivciError
from equivci.results import ModelResult


@dataclasses.dataclass(frozen=True)
class Changes:
    ref: str
    files: frozenset[str]  # changed, added, deleted or renamed (old and new names), untracked
    lines: Mapping[str, frozenset[int]]  # new-side lines added or modified, per file

    def touches(self, paths: Iterable[str]) -> bool:
        return any(p in self.files for p in paths)

    def changed_line(self, path: str | None, line: int | None) -> bool:
        if path is None or line is None:
            return False
        return line in self.lines.get(path, frozenset())


def _repo(repo_root: str | Path):
    import git

    try:
        return git.Repo(repo_root, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise EquivciError(
            f"--changed-since needs a git repository, and {repo_root} is not inside one; "
            "drop --changed-since (or pass --all) to verify every model."
        ) from exc


def changes_since(repo_root: str | Path, ref: str) -> Changes:
    """Files and new-side lines that differ between REF and the working tree (untracked files included)."""
    import git

    from equivci.ci.diff import parse_unified_diff

    repo = _repo(repo_root)
    g = repo.git(c="core.quotepath=off")
    try:
        commit = repo.commit(ref).hexsha
    except (git.BadName, ValueError, git.GitCommandError) as exc:
        raise EquivciError(
            f"--changed-since {ref}: git does not know this revision in {repo.working_tree_dir}; "
            "pass a branch, tag or commit that exists locally (in CI, fetch it first, e.g. "
            "actions/checkout with fetch-depth: 0)."
        ) from exc
    names = g.diff(commit, "--name-status", "--no-color", "-z", "--find-renames")
    files: set[str] = set()
    fields = [f for f in names.split("\0") if f]
    i = 0
    while i < len(fields):
        status = fields[i]
        count = 2 if status[:1] in ("R", "C") else 1
        files.update(fields[i + 1 : i + 1 + count])
        i += 1 + count
    patch = g.diff(commit, "--no-color", "--no-ext-diff", "--unified=0", "--find-renames")
    lines = {path: fd.added for path, fd in parse_unified_diff(patch).files.items()}
    root = Path(repo.working_tree_dir)
    for rel in repo.untracked_files:
        if rel.startswith(".equivci/"):  # equivci's own cache and reports
            continue
        files.add(rel)
        try:
            n = len((root / rel).read_bytes().splitlines())
        except OSError:
            n = 0
        lines[rel] = frozenset(range(1, n + 1))
    return Changes(ref=ref, files=frozenset(files), lines=dict(lines))


def model_files(entrypoint_files: Iterable[str], recorded: Iterable[str], manifest_rel: str) -> set[str]:
    """What a model depends on, for selection: its recorded sources, its entrypoint files, the manifest."""
    return set(entrypoint_files) | set(recorded) | {manifest_rel}


def mark_changed(result: ModelResult, changes: Changes | None) -> ModelResult:
    """Flag the findings that sit on lines changed since REF (and only those)."""
    if changes is None or not result.findings:
        return result
    findings = tuple(dataclasses.replace(f, changed=changes.changed_line(f.path, f.line)) for f in result.findings)
    return dataclasses.replace(result, findings=findings)
