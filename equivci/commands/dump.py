"""`equivci dump`: write one model's captured HLO and source map, for debugging a verdict."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from equivci.capture import run as capture_run
from equivci.capture.types import CapturedModel
from equivci.commands.folders import require_folder
from equivci.commands.verify import DebugOption, ManifestOption
from equivci.errors import EquivciError
from equivci.hlo.parser import parse_module
from equivci.manifest import load_manifest
from equivci.pipeline import select_models


def _op_locations(hlo_text: str, repo_root: Path) -> dict[str, dict[str, Any]]:
    """HLO op name -> innermost source frame inside the repository, as {path, line}."""
    ops: dict[str, dict[str, Any]] = {}
    for computation in parse_module(hlo_text).computations.values():
        for inst in computation.instructions:
            for loc in inst.stack:  # innermost first
                try:
                    rel = Path(loc.file).resolve().relative_to(repo_root)
                except ValueError:
                    continue
                ops[inst.name] = {"path": str(rel), "line": loc.line}
                break
    return ops


def source_map(captured: CapturedModel) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": captured.name,
        "mesh": dict(captured.mesh),
        "inputs": [dataclasses.asdict(p) for p in captured.inputs],
        "outputs": [dataclasses.asdict(p) for p in captured.outputs],
    }
    # The HLO parser is a separate stage; without it the placements alone are still useful.
    if importlib.util.find_spec("equivci.hlo.parser") is not None:
        root = Path(captured.repo_root)
        doc["reference"] = _op_locations(captured.reference_hlo, root)
        doc["distributed"] = _op_locations(captured.distributed_hlo, root)
    return doc


def dump(
    model: Annotated[str, typer.Option("--model", help="The model to capture.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write the files into (created if needed).")],
    manifest: ManifestOption = Path("equivci.yaml"),
    debug: DebugOption = False,
) -> None:
    """Write reference.hlo.txt, distributed.hlo.txt and sourcemap.json for one model."""
    require_folder("--out", out)
    loaded = load_manifest(manifest)
    (spec,) = select_models(loaded, [model], [])
    # Through the module: tests stand a fake capture in for it there.
    captured = capture_run.capture_model(spec, loaded, debug=debug)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "reference.hlo.txt").write_text(captured.reference_hlo)
        (out / "distributed.hlo.txt").write_text(captured.distributed_hlo)
        (out / "sourcemap.json").write_text(json.dumps(source_map(captured), indent=2) + "\n")
    except OSError as exc:
        raise EquivciError(
            f"--out {out}: cannot write the files there ({exc.strerror or exc}); pass a folder you can write to."
        ) from None
    typer.echo(f"equivci: wrote reference.hlo.txt, distributed.hlo.txt and sourcemap.json to {out}")


def register(app: typer.Typer) -> None:
    app.command("dump")(dump)
