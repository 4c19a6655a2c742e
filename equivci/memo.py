"""The memo of a manifest's workspace: what its cache folder recorded for a model. The store itself
is equivci.cache, which knows folders and keys but not manifests or repositories."""

from __future__ import annotations

from pathlib import Path

# The capture child (equivci.capture.child) computes its content keys through this module.
from equivci.cache import (  # noqa: F401
    Memo,
    canonical_mlir,
    key,
    location_digest,
    named_files,
    repository_files,
)
from equivci.manifest import Manifest, ModelSpec
from equivci.workspace import Workspace


def recorded_sources(manifest: Manifest, model: ModelSpec, cache_dir: Path | None = None) -> set[str] | None:
    """Absolute paths of the source files recorded for `model` at its last capture (the files behind
    its ops and the repository modules it imported), or None when the memo has never seen it."""
    workspace = Workspace.of(manifest)
    record = Memo(workspace.cache_dir(cache_dir)).last_capture(workspace.manifest_rel, model.name)
    if record is None:
        return None
    return {str(workspace.repo_root / rel) for rel in record["sources"]}
