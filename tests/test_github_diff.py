"""PR diff lines from a real git repository and from the pulls/files `patch` field agree."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fake_github import pull_files_from_git

from equivci.git import DiffLines, from_pull_files, parse_patch, parse_unified_diff, pr_diff_lines


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.invalid")
    git(repo, "config", "user.name", "t")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "a.py").write_text("".join(f"line {i}\n" for i in range(1, 31)))
    (repo / "old.py").write_text("gone\n")
    (repo / "same.py").write_text("x = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "feature")
    lines = (repo / "pkg" / "a.py").read_text().splitlines()
    lines[9] = "line 10 changed"  # line 10 modified
    lines.insert(20, "inserted")  # new line 21
    (repo / "pkg" / "a.py").write_text("\n".join(lines) + "\n")
    (repo / "old.py").unlink()
    (repo / "new file.py").write_text("a\nb\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "head")
    head = git(repo, "rev-parse", "HEAD")
    return repo, base, head


def test_git_diff_lines(tmp_path):
    repo, base, head = make_repo(tmp_path)
    diff = pr_diff_lines(repo, base, head)
    a = diff.files["pkg/a.py"]
    assert a.added == {10, 21}
    # context: 3 lines around each change, on the new side
    assert a.commentable == set(range(7, 14)) | set(range(18, 25))
    assert diff.in_diff("pkg/a.py", 10) and diff.in_diff("pkg/a.py", 7)
    assert not diff.in_diff("pkg/a.py", 1) and not diff.in_diff("pkg/a.py", 15)
    assert diff.changed("pkg/a.py", 21) and not diff.changed("pkg/a.py", 20)
    assert diff.files["new file.py"].added == {1, 2}
    assert "old.py" not in diff.files and "same.py" not in diff.files
    assert not diff.in_diff(None, 3) and not diff.in_diff("pkg/a.py", None)


def test_api_patches_give_the_same_lines(tmp_path):
    repo, base, head = make_repo(tmp_path)
    from_api = from_pull_files(pull_files_from_git(repo, base, head))
    from_repo = pr_diff_lines(repo, base, head)
    assert from_api.files == from_repo.files


def test_parse_patch_edge_cases():
    patch = "@@ -1 +1,2 @@\n-old\n+new\n+more\n\\ No newline at end of file\n@@ -10,2 +11,3 @@ def f():\n ctx\n+add\n \n"
    fd = parse_patch(patch)
    assert fd.added == {1, 2, 12}
    assert fd.commentable == {1, 2, 11, 12, 13}


def test_parse_unified_diff_quoted_path_and_deletion():
    text = (
        'diff --git "a/na\\303\\257ve.py" "b/na\\303\\257ve.py"\n'
        "--- \"a/na\\303\\257ve.py\"\n"
        '+++ "b/na\\303\\257ve.py"\n'
        "@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/d.py b/d.py\ndeleted file mode 100644\n--- a/d.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
    )
    diff = parse_unified_diff(text)
    assert diff.paths() == ["naïve.py"]
    assert diff.files["naïve.py"].added == {1}
    assert DiffLines().in_diff("x", 1) is False
