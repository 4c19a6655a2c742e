"""Tiny model packages written into a temp folder for tests: one module plus a v1 manifest.

Lines of interest in the module source carry a `# MARK:name` comment; `line_of` finds them.
"""

from __future__ import annotations

from pathlib import Path

from equivci.capture.run import capture_model
from equivci.capture.types import CapturedModel
from equivci.hlo.parser import parse_module
from equivci.manifest import Manifest, ModelSpec, load_manifest
from equivci.prove.programs import build_programs
from equivci.results import ModelResult
from equivci.translate.programs import Programs
from equivci.verify.engine import verify_model


def line_of(source: str, mark: str) -> int:
    for number, line in enumerate(source.splitlines(), start=1):
        if f"# MARK:{mark}" in line:
            return number
    raise KeyError(mark)


def manifest_text(cases: list[tuple[str, ...]], mesh: str = "") -> str:
    """A v1 manifest of models (name, reference function, distributed function[, mesh]) of
    `model.py`, with `inputs: model.py:inputs` and `mesh` (YAML flow text, e.g. "{data: 4}") where a
    case names none."""
    return "version: 1\nmodels:\n" + "".join(
        f"  - {{name: {name}, reference: model.py:{ref}, distributed: model.py:{dist}, inputs: model.py:inputs, "
        f"mesh: {own[0] if own else mesh}}}\n"
        for name, ref, dist, *own in cases
    )


def write_package(root: Path, module: str, source: str, manifest: str) -> Manifest:
    (root / module).write_text(source)
    (root / "equivci.yaml").write_text(manifest)
    return load_manifest(root / "equivci.yaml")


def model_named(manifest: Manifest, name: str) -> ModelSpec:
    return next(m for m in manifest.models if m.name == name)


_captures: dict[tuple[Path, str], CapturedModel] = {}


def capture_named(manifest: Manifest, name: str) -> CapturedModel:
    """One model of the manifest, captured once per test session (the tests do not edit the files of
    their manifests after writing them)."""
    key = (manifest.path, name)
    if key not in _captures:
        _captures[key] = capture_model(model_named(manifest, name), manifest)
    return _captures[key]


def verify_named(manifest: Manifest, name: str) -> ModelResult:
    """Verify one model of the manifest in this process (no cache, no sandbox)."""
    return verify_model(model_named(manifest, name), manifest, capture_named(manifest, name))


def programs_of(captured: CapturedModel) -> Programs:
    """Both programs of a capture as terms, as the verifier builds them."""
    return build_programs(
        parse_module(captured.reference_hlo),
        parse_module(captured.distributed_hlo),
        captured.inputs,
        captured.outputs,
        captured.num_devices,
    )
