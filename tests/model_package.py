"""Tiny model packages written into a temp folder for tests: one module plus a v1 manifest.

Lines of interest in the module source carry a `# MARK:name` comment; `line_of` finds them.
"""

from __future__ import annotations

from pathlib import Path

from equivci.manifest import Manifest, load_manifest


def line_of(source: str, mark: str) -> int:
    for number, line in enumerate(source.splitlines(), start=1):
        if f"# MARK:{mark}" in line:
            return number
    raise KeyError(mark)


def write_package(root: Path, module: str, source: str, manifest: str) -> Manifest:
    (root / module).write_text(source)
    (root / "equivci.yaml").write_text(manifest)
    return load_manifest(root / "equivci.yaml")


def captured(manifest: Manifest, name: str):
    """The manifest's model `name` and its capture (a child process)."""
    from equivci.capture.run import capture_model

    model = next(m for m in manifest.models if m.name == name)
    return model, capture_model(model, manifest)


def verify(manifest: Manifest, name: str):
    """The verdict on the manifest's model `name`, oracle included."""
    from equivci.verify.engine import verify_model

    model, capture = captured(manifest, name)
    return verify_model(model, manifest, capture)
