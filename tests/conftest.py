"""Fixtures shared by the test modules that run equivci on real temporary git repositories."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from equivci import options


@pytest.fixture()
def repo(warm_template: Path, tmp_path: Path, monkeypatch) -> Path:
    """A fresh copy of the module's `warm_template` repository (its cache included), so each test
    starts from the same committed, already verified state."""
    monkeypatch.delenv(options.ENV_CACHE_DIR, raising=False)
    copy = tmp_path / "repo"
    shutil.copytree(warm_template, copy, symlinks=True)
    return copy
