"""Output folders named on the command line, checked before a run rather than after it."""

from __future__ import annotations

from pathlib import Path

from equivci.errors import EquivciError


def require_folder(option: str, folder: Path, alternative: str = "") -> None:
    """A usage error when `folder`, or the nearest of its parents that exists, is not a folder."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise EquivciError(
            f"{option} {folder}: {blocker} is a file, not a folder; pass a folder (it is created if needed){alternative}."
        )
