"""The workspace of a run: the repository that holds the manifest, the manifest's path in it, the
cache folder and the run's options, resolved once and passed down (findings and memo records use
repository paths)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from equivci.cache import DEFAULT_CACHE_DIR
from equivci.git import repo_root
from equivci.manifest import Manifest
from equivci.options import Options


@dataclasses.dataclass(frozen=True)
class Workspace:
    manifest: Manifest
    repo_root: Path
    manifest_rel: str  # the manifest's path from the repository root, else its file name
    options: Options

    @classmethod
    def of(cls, manifest: Manifest, options: Options | None = None) -> Workspace:
        root = repo_root(manifest.root)
        try:
            rel = str(manifest.path.relative_to(root))
        except ValueError:
            rel = manifest.path.name
        return cls(manifest, root, rel, options or Options.from_env())

    def cache_dir(self, override: Path | None = None) -> Path:
        """--cache-dir, else $EQUIVCI_CACHE_DIR, else .equivci/cache at the repository root."""
        if override is not None:
            return Path(override).resolve()
        return self.options.cache_dir or self.repo_root / DEFAULT_CACHE_DIR


def manifest_display_path(manifest: Manifest) -> str:
    """The manifest's path relative to the git repository root (findings use repository paths)."""
    return Workspace.of(manifest).manifest_rel
