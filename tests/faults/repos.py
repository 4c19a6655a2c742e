"""Temporary git repositories with small real JAX models, and the CLI run as a user runs it."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from fake_github import MLP_REFERENCE, MLP_TP

TRACEBACK = "Traceback (most recent call last)"



def model_entry(name: str, distributed: str = "models/mlp_tp.py:mlp", inputs: str = "models/mlp.py:inputs") -> str:
    """One model of a manifest's list, against the reference MLP on a tp=2 mesh."""
    return (f"  - name: {name}\n    reference: models/mlp.py:mlp\n    distributed: {distributed}\n"
            f"    inputs: {inputs}\n    mesh: {{tp: 2}}\n")


MANIFEST = "version: 1\nmodels:\n" + model_entry("mlp-tp")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout.strip()


def make_repo(root: Path, files: dict[str, str] | None = None, manifest: str = MANIFEST) -> Path:
    """A committed repository holding a correct tensor-parallel MLP (tp=2) and its manifest."""
    root.mkdir(parents=True, exist_ok=True)
    contents = {"models/mlp.py": MLP_REFERENCE, "models/mlp_tp.py": MLP_TP, "equivci.yaml": manifest,
                ".gitignore": ".equivci/\n", **(files or {})}
    for rel, text in contents.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "models")
    return root


@dataclasses.dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def tracebacks(self) -> int:
        return (self.stdout + self.stderr).count(TRACEBACK)


def equivci(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600, **kwargs) -> Run:
    """The installed CLI in a fresh process, with GitHub's variables cleared unless given."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_", "EQUIVCI_"))}
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "equivci", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=timeout, check=False, **kwargs)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` outside .git and .equivci (the user's files)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith((".git/", ".equivci/")) and "__pycache__" not in rel:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out
