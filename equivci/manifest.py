"""Manifest v1 (equivci.yaml): schema and validation. Static checks only; nothing is imported here."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Entrypoint:
    spec: str  # as written in the manifest, e.g. "models/llama.py:forward"
    function: str
    file: Path | None = None  # absolute path, for the FILE.py:FUNC form
    module: str | None = None  # dotted module, for the package.module:FUNC form


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    reference: Entrypoint
    distributed: Entrypoint
    inputs: Entrypoint
    mesh: tuple[tuple[str, int], ...]
    tags: tuple[str, ...] = ()

    @property
    def num_devices(self) -> int:
        n = 1
        for _, size in self.mesh:
            n *= size
        return n


@dataclasses.dataclass(frozen=True)
class Manifest:
    path: Path  # absolute path of the manifest file
    root: Path  # the manifest's folder; entrypoint paths are relative to it
    models: tuple[ModelSpec, ...]


def load_manifest(path: Path) -> Manifest:
    raise NotImplementedError  # written in the manifest change
