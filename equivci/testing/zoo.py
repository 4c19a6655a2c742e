"""Enumerate the labelled models of the bundled manifests (examples, buggy variants, zoo).

Each case pairs a manifest model with its expected verdict from the sidecar expected.yaml
(examples/models/expected.yaml for equivci.yaml and configs/buggy.yaml,
examples/zoo/expected.yaml for configs/zoo.yaml). Used by the numeric-oracle tests and by
anyone who wants to cross-check the verifier against the same labels.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from equivci.manifest import ModelSpec, load_manifest

REPO = Path(__file__).resolve().parents[2]

# manifest (relative to the repository root) -> sidecar with the expected verdicts
MANIFESTS = {
    "equivci.yaml": "examples/models/expected.yaml",
    "configs/buggy.yaml": "examples/models/expected.yaml",
    "configs/zoo.yaml": "examples/zoo/expected.yaml",
    "configs/localize.yaml": "examples/localize/expected.yaml",
}
SLOW_TAG = "slow"


@dataclasses.dataclass(frozen=True)
class Case:
    manifest: Path  # absolute
    manifest_rel: str  # as in MANIFESTS
    model: ModelSpec
    verdict: str  # "equivalent" | "different"
    bug_line: str | None  # "examples/zoo/file.py:LINE", relative to the repository root
    note: str
    pattern: str | None = None  # zoo only: the parallelism pattern

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def slow(self) -> bool:
        return SLOW_TAG in self.model.tags

    @property
    def id(self) -> str:
        return f"{Path(self.manifest_rel).stem}:{self.name}"


def load_expected(sidecar: str) -> dict:
    return yaml.safe_load((REPO / sidecar).read_text()) or {}


def cases(manifests: dict[str, str] = MANIFESTS) -> list[Case]:
    out: list[Case] = []
    for rel, sidecar in manifests.items():
        labels = load_expected(sidecar)
        manifest = load_manifest(REPO / rel)
        for model in manifest.models:
            label = labels.get(model.name)
            if label is None:
                raise KeyError(f"{rel}: model '{model.name}' has no label in {sidecar}")
            out.append(
                Case(
                    manifest=manifest.path,
                    manifest_rel=rel,
                    model=model,
                    verdict=label["verdict"],
                    bug_line=label.get("bug_line"),
                    note=label.get("note", ""),
                    pattern=label.get("pattern"),
                )
            )
    return out
