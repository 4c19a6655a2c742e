"""`equivci precommit FILE...`: verify the models that the given (staged) files feed.

pre-commit passes the staged file names; a model is selected when one of them is its reference,
distributed or inputs file, a source file recorded for it at its last capture (when the memo knows),
or the manifest itself (which selects every model). Findings print as `path:line: message`; the exit
code is 1 when a model is not verified (2 for manifest or capture errors), 0 otherwise.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

from equivci import memo
from equivci.commands.verify import DebugOption, ManifestOption
from equivci.manifest import Entrypoint, Manifest, ModelSpec, load_manifest
from equivci.pipeline import manifest_display_path, run_models, select_models
from equivci.report.text import RunProgress
from equivci.results import Report


def entrypoint_file(ep: Entrypoint, root: Path) -> Path | None:
    """The file defining an entrypoint: FILE.py directly, package.module resolved under the manifest folder."""
    if ep.file is not None:
        return Path(ep.file).resolve()
    if ep.module:
        rel = Path(*ep.module.split("."))
        for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def recorded_sources(manifest: Manifest, model: ModelSpec) -> set[Path]:
    """Source files recorded for the model's ops at its last capture (none before the first)."""
    return {Path(p).resolve() for p in memo.recorded_sources(manifest, model) or ()}


def model_files(manifest: Manifest, model: ModelSpec) -> set[Path]:
    if model.hlo is not None:
        return set(model.hlo.files()) | recorded_sources(manifest, model)
    files = {entrypoint_file(ep, manifest.root) for ep in model.entrypoints()}
    return {f for f in files if f is not None} | recorded_sources(manifest, model)


def affected_models(manifest: Manifest, models: Iterable[ModelSpec], filenames: Iterable[Path]) -> list[ModelSpec]:
    changed = {Path(f).resolve() for f in filenames}
    models = list(models)
    if manifest.path.resolve() in changed:
        return models
    return [m for m in models if model_files(manifest, m) & changed]


def finding_lines(report: Report, manifest_rel: str) -> list[str]:
    lines = []
    for m in report.models:
        for f in m.findings:
            where = f.location() if f.path is not None else manifest_rel
            message = f.message.replace("\n", " ")
            lines.append(f"{where}: {message} [{m.name}: {m.status.value}]")
        if not m.findings and m.status.value != "verified":
            lines.append(f"{manifest_rel}: model {m.name} is {m.status.value}")
    return lines


def precommit(
    filenames: Annotated[
        list[Path] | None, typer.Argument(help="Changed files (pre-commit passes the staged ones).")
    ] = None,
    manifest: ManifestOption = Path("equivci.yaml"),
    all_models: Annotated[bool, typer.Option("--all", help="Verify every model, whatever the files.")] = False,
    debug: DebugOption = False,
) -> None:
    """Verify the models fed by FILENAMES; print `path:line: message` findings; exit 1 on findings."""
    loaded = load_manifest(manifest)
    candidates = select_models(loaded, [], [])
    selected = candidates if all_models else affected_models(loaded, candidates, filenames or [])
    if not selected:
        print("equivci: no model is fed by these files; nothing to verify", file=sys.stderr)
        raise typer.Exit(0)

    with RunProgress(len(selected)) as progress, contextlib.redirect_stdout(sys.stderr):
        report = run_models(loaded, selected, progress, debug=debug)
    for line in finding_lines(report, manifest_display_path(loaded)):
        print(line)
    raise typer.Exit(report.exit_code())


def register(app: typer.Typer) -> None:
    app.command("precommit")(precommit)
