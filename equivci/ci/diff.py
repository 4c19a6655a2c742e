"""Which lines of which files are inside a pull request's diff.

GitHub accepts a review comment on a line (`side: RIGHT`) only if that line appears in one of the
file's diff hunks on the new side: an added line or a context line. A review with a single comment
elsewhere is rejected whole (HTTP 422), so review comments are filtered with this first.

Two sources, same result: `git diff BASE...HEAD` (what GitHub shows: changes since the merge base)
via gitpython, or the `patch` field of the pulls/files API when the base commit is not fetched.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclasses.dataclass(frozen=True)
class FileDiff:
    commentable: frozenset[int]  # new-side lines inside hunks (added or context)
    added: frozenset[int]  # new-side lines added or modified


@dataclasses.dataclass(frozen=True)
class DiffLines:
    files: dict[str, FileDiff] = dataclasses.field(default_factory=dict)

    def in_diff(self, path: str | None, line: int | None) -> bool:
        if path is None or line is None:
            return False
        fd = self.files.get(path)
        return fd is not None and line in fd.commentable

    def changed(self, path: str | None, line: int | None) -> bool:
        fd = self.files.get(path) if path else None
        return fd is not None and line is not None and line in fd.added

    def paths(self) -> list[str]:
        return sorted(self.files)


def parse_patch(patch: str) -> FileDiff:
    """Hunks of one file (the `patch` of pulls/files, or one file's part of a unified diff)."""
    commentable: set[int] = set()
    added: set[int] = set()
    new_line = 0
    remaining_old = remaining_new = 0
    for raw in patch.splitlines():
        m = _HUNK_RE.match(raw)
        if m:
            remaining_old = int(m.group(2)) if m.group(2) is not None else 1
            new_line = int(m.group(3))
            remaining_new = int(m.group(4)) if m.group(4) is not None else 1
            continue
        if remaining_old <= 0 and remaining_new <= 0:
            continue  # outside a hunk (file headers)
        if raw.startswith("\\"):  # "\ No newline at end of file"
            continue
        tag = raw[:1]
        if tag == "+":
            commentable.add(new_line)
            added.add(new_line)
            new_line += 1
            remaining_new -= 1
        elif tag == "-":
            remaining_old -= 1
        else:  # context (" ", or an empty line for a blank context line)
            commentable.add(new_line)
            new_line += 1
            remaining_new -= 1
            remaining_old -= 1
    return FileDiff(frozenset(commentable), frozenset(added))


def _unquote(path: str) -> str:
    """git quotes unusual paths: "a/dir/na\\303\\257ve.py" -> a/dir/naïve.py."""
    if len(path) >= 2 and path[0] == path[-1] == '"':
        body = path[1:-1]
        try:
            return body.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
        except (UnicodeError, ValueError):
            return body
    return path


def parse_unified_diff(text: str) -> DiffLines:
    """A multi-file `git diff` output -> DiffLines keyed by the new path."""
    files: dict[str, FileDiff] = {}
    path: str | None = None
    chunk: list[str] = []

    def flush() -> None:
        if path is not None and chunk:
            files[path] = parse_patch("\n".join(chunk))

    for raw in text.splitlines():
        if raw.startswith("diff --git "):
            flush()
            path, chunk = None, []
            continue
        if raw.startswith("+++ ") and not chunk:
            target = _unquote(raw[4:].rstrip("\t"))
            path = None if target == "/dev/null" else (target[2:] if target.startswith("b/") else target)
            continue
        if raw.startswith("@@") or chunk:
            chunk.append(raw)
    flush()
    return DiffLines(files)


def from_git(repo_root: str | Path, base: str, head: str) -> DiffLines:
    """`git diff BASE...HEAD` in the repository (raises git.GitCommandError if a commit is missing)."""
    import git

    repo = git.Repo(repo_root, search_parent_directories=True)
    text = repo.git(c="core.quotepath=off").diff(
        f"{base}...{head}", "--no-color", "--no-ext-diff", "--unified=3", "--find-renames"
    )
    return parse_unified_diff(text)


def from_pull_files(files: Iterable[dict[str, Any]]) -> DiffLines:
    """The pulls/{n}/files API answer (each item has `filename` and, unless binary or huge, `patch`)."""
    out: dict[str, FileDiff] = {}
    for item in files:
        if item.get("status") == "removed":
            continue
        patch = item.get("patch")
        if patch:
            out[item["filename"]] = parse_patch(patch)
    return DiffLines(out)
