"""Everything equivci asks git: the repository root, the files and lines changed since a ref, the
lines of a pull request's diff, and what to do in a shallow clone.

- Paths are repository-relative, exactly as on disk: file lists are read NUL-separated (`-z`) and
  patch headers with `core.quotepath=off` (what git still quotes, control characters and quotes, is
  unquoted here), so `tp ü.py` stays `tp ü.py`.
- "Changed since REF" compares REF with the working tree, as the user sees it: committed, staged
  and unstaged edits count, and so do untracked files (every line of which is new).
- A ref that a shallow clone (actions/checkout's default depth 1) does not have is fetched when a
  remote can give it; when nothing can, the changes are `unknown` and every model counts as changed
  (a full run, with a warning naming `fetch-depth: 0`), never a guess. A ref that a complete
  history does not know is a usage error.
- A PR's diff lines (for review comments) come from `git diff BASE...HEAD`, else from the
  pulls/files API's `patch` fields (`from_pull_files`).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from equivci.errors import EquivciError
from equivci.results import ModelResult

FETCH_TIMEOUT_SECONDS = 120
FETCH_DEPTH_HINT = "In GitHub Actions, check out the whole history: actions/checkout with `fetch-depth: 0`."


def repo_root(folder: str | Path) -> Path:
    """The git work tree containing `folder`: the nearest folder with a `.git` entry (a repository,
    a linked work tree or a submodule), or `folder` itself outside git. A plain walk, as git does
    it: starting `git` on every run would cost more than the walk."""
    start = Path(folder).resolve()
    return next((p for p in (start, *start.parents) if (p / ".git").exists()), start)


# --- diff lines ---------------------------------------------------------------------------------

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclasses.dataclass(frozen=True)
class FileDiff:
    commentable: frozenset[int]  # new-side lines inside hunks (added or context)
    added: frozenset[int]  # new-side lines added or modified


@dataclasses.dataclass(frozen=True)
class DiffLines:
    """Which lines of which files a diff holds. GitHub accepts a review comment (`side: RIGHT`)
    only on a new-side line inside a hunk, and rejects a whole review with one comment elsewhere."""

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


_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def unquote(path: str) -> str:
    """A path as git prints it in patch headers: C-quoted ("a/x\\ty.py", octal bytes "\\303\\274")
    when it holds characters git escapes, else as is."""
    if not (len(path) >= 2 and path[0] == path[-1] == '"'):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and re.fullmatch(r"[0-7]{3}", body[i + 1 : i + 4]):
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            if nxt in _C_ESCAPES:
                out.append(_C_ESCAPES[nxt])
                i += 2
                continue
        out += c.encode("utf-8", "surrogateescape")
        i += 1
    return out.decode("utf-8", "replace")


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
            # git ends the name with a tab when it holds a space, so a patch tool can tell where it ends.
            target = unquote(raw[4:].removesuffix("\t"))
            path = None if target == "/dev/null" else (target.removeprefix("b/"))
            continue
        if raw.startswith("@@") or chunk:
            chunk.append(raw)
    flush()
    return DiffLines(files)


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


# --- the repository -----------------------------------------------------------------------------


class _Git:
    """A GitPython command runner for one work tree: no prompts, English messages, fixed output."""

    def __init__(self, root: str | Path, purpose: str):
        try:
            # lazy: GitPython is imported only by commands that read a repository; the error below names it
            import git
        except ImportError as exc:  # GitPython imports fine without a git binary only until used
            raise EquivciError(
                f"{purpose} needs git, and it cannot be run here ({exc}); install git, or drop {purpose}."
            ) from None
        self._git = git
        self.purpose = purpose
        try:
            self.repo = git.Repo(root, search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise EquivciError(
                f"{purpose} needs a git repository, and {root} is not inside one; "
                "drop it (or pass --all) to verify every model."
            ) from exc
        self.root = Path(self.repo.working_tree_dir or root)

    def run(self, *args: str, timeout: float | None = None) -> str:
        out = self.try_run(*args, timeout=timeout)
        if out is None:
            raise EquivciError(
                f"{self.purpose}: `git {' '.join(args)}` failed in {self.root}: {self.failure}; "
                "check the repository with that command."
            )
        return out

    def try_run(self, *args: str, timeout: float | None = None) -> str | None:
        kwargs: dict[str, Any] = {"kill_after_timeout": timeout} if timeout else {}
        try:
            return self.repo.git.execute(
                ["git", "-c", "core.quotepath=off", "-c", "color.ui=false", *args],
                # A fetch must fail, not wait for a password; messages in English.
                env={"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"},
                strip_newline_in_stdout=False,
                **kwargs,
            )
        except self._git.CommandError as exc:  # a failing command, or no git binary at all
            lines = str(getattr(exc, "stderr", "") or exc).strip().strip("'").splitlines()
            self.failure = (lines[-1] if lines else type(exc).__name__).strip()
            return None

    def commit(self, ref: str) -> str | None:
        """The commit `ref` names, or None when this clone does not have it."""
        out = self.try_run("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
        return (out or "").strip() or None

    def shallow(self) -> bool:
        return (self.try_run("rev-parse", "--is-shallow-repository") or "").strip() == "true"

    def remotes(self) -> list[str]:
        return [r for r in (self.try_run("remote") or "").split() if r]

    def fetch_for(self, ref: str, log) -> str | None:
        """Fetch what `ref` needs from the first remote (the commit itself when `ref` is a full
        hash, else deeper history, then the whole of it); the commit, or None."""
        remotes = self.remotes()
        if not remotes:
            return None
        remote = "origin" if "origin" in remotes else remotes[0]
        shallow = self.shallow()
        attempts: list[tuple[str, ...]] = []
        if re.fullmatch(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}", ref):
            # --depth only where the clone is shallow already: a complete history stays complete.
            attempts.append(("fetch", "--quiet", "--no-tags", *(["--depth=1"] if shallow else []), remote, ref))
        if shallow:
            attempts += [
                ("fetch", "--quiet", "--no-tags", "--deepen=50", remote),
                ("fetch", "--quiet", "--no-tags", "--unshallow", remote),
            ]
        for args in attempts:
            log(f"equivci: {ref} is not in this clone; running `git {' '.join(args)}`")
            if self.try_run(*args, timeout=FETCH_TIMEOUT_SECONDS) is None:
                continue
            commit = self.commit(ref)
            if commit is not None:
                return commit
        return None


# Whatever the user's git configuration says (diff.external, color.diff, diff.noprefix,
# diff.mnemonicPrefix, diff.renames): the output parse_unified_diff reads.
_DIFF_OPTIONS = ("--no-ext-diff", "--no-color", "--no-textconv", "--find-renames", "--src-prefix=a/", "--dst-prefix=b/")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- changes since a ref ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Changes:
    ref: str
    files: frozenset[str]  # changed, added, deleted or renamed (old and new names), untracked
    lines: Mapping[str, frozenset[int]]  # new-side lines added or modified, per file
    known: bool = True  # False: REF could not be read, so every file counts as changed

    def touches(self, paths: Iterable[str]) -> bool:
        return not self.known or any(p in self.files for p in paths)

    def changed_line(self, path: str | None, line: int | None) -> bool:
        if path is None or line is None:
            return False
        return line in self.lines.get(path, frozenset())


def changes_since(root: str | Path, ref: str, log=_log) -> Changes:
    """Files and new-side lines that differ between REF and the working tree (untracked files
    included). In a shallow clone without REF, fetches it when a remote has it; else every file
    counts as changed (`known=False`) and `log` says so."""
    g = _Git(root, f"--changed-since {ref}")
    commit = g.commit(ref) or g.fetch_for(ref, log)
    if commit is None:
        if g.shallow():
            log(
                f"equivci: warning: --changed-since {ref}: this is a shallow clone without that revision, and it "
                f"could not be fetched; verifying every selected model instead. {FETCH_DEPTH_HINT}"
            )
            return Changes(ref=ref, files=frozenset(), lines={}, known=False)
        raise EquivciError(
            f"--changed-since {ref}: git does not know this revision in {g.root}; pass a branch, tag or "
            f"commit that exists locally (or fetch it first). {FETCH_DEPTH_HINT}"
        )
    files: set[str] = set()
    fields = [f for f in g.run("diff", *_DIFF_OPTIONS, "--name-status", "-z", commit, "--").split("\0") if f]
    i = 0
    while i < len(fields):
        count = 2 if fields[i][:1] in ("R", "C") else 1
        files.update(fields[i + 1 : i + 1 + count])
        i += 1 + count
    patch = g.run("diff", *_DIFF_OPTIONS, "--unified=0", commit, "--")
    lines = {path: fd.added for path, fd in parse_unified_diff(patch).files.items()}
    for rel in g.run("ls-files", "-z", "--others", "--exclude-standard").split("\0"):
        if not rel or rel.startswith(".equivci/"):  # equivci's own cache and reports
            continue
        files.add(rel)
        try:
            n = len((g.root / rel).read_bytes().splitlines())
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


# --- a pull request's diff ----------------------------------------------------------------------


def pr_diff_lines(root: str | Path, base: str, head: str, log=_log) -> DiffLines | None:
    """`git diff BASE...HEAD` (what GitHub shows: the changes since the merge base), fetching what
    a shallow clone lacks; None when git cannot give it (the caller asks the API)."""
    try:
        g = _Git(root, "the pull request diff")
    except EquivciError:
        return None
    args = ("diff", *_DIFF_OPTIONS, "--unified=3", f"{base}...{head}", "--")
    text = g.try_run(*args)
    if text is None:
        for sha in (base, head):
            if g.commit(sha) is None:
                g.fetch_for(sha, log)
        if g.shallow():  # both commits may be here now, but not yet their merge base
            g.try_run("fetch", "--quiet", "--no-tags", "--unshallow", timeout=FETCH_TIMEOUT_SECONDS)
        text = g.try_run(*args)
    return parse_unified_diff(text) if text is not None else None
