"""The verify pipeline over the selected models: capture, then verify, one model at a time.

A failing model becomes an `error` result and the run goes on, so one broken entrypoint does not
hide the verdicts of the other models.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

from equivci.errors import EquivciError
from equivci.manifest import Manifest, ModelSpec
from equivci.results import Finding, ModelResult, Report, Status


class Progress(Protocol):
    def started(self, name: str) -> None: ...

    def finished(self, result: ModelResult) -> None: ...


def select_models(manifest: Manifest, names: list[str], tags: list[str]) -> list[ModelSpec]:
    """Models named by --model or carrying any --tag (all models when neither is given), in manifest order."""
    known = manifest.names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise EquivciError(
            f"{manifest.path.name}: no model named {', '.join(repr(n) for n in unknown)}; "
            f"the manifest defines {', '.join(known)}. Pass one of these to --model."
        )
    all_tags = sorted({t for m in manifest.models for t in m.tags})
    missing = [t for t in tags if t not in all_tags]
    if missing:
        defined = f"the manifest uses {', '.join(all_tags)}" if all_tags else "no model in the manifest has tags"
        raise EquivciError(f"{manifest.path.name}: no model is tagged {', '.join(repr(t) for t in missing)}; {defined}.")
    if not names and not tags:
        return list(manifest.models)
    return [m for m in manifest.models if m.name in names or set(m.tags) & set(tags)]


def manifest_display_path(manifest: Manifest) -> str:
    """The manifest's path relative to the git repository root (findings use repository paths)."""
    from equivci.capture.run import repo_root_of

    try:
        return str(manifest.path.relative_to(repo_root_of(manifest.root)))
    except ValueError:
        return manifest.path.name


def _error_result(model: ModelSpec, path: str | None, message: str, seconds: float) -> ModelResult:
    finding = Finding(path=path, line=None, severity="error", layer=None, message=message)
    return ModelResult(name=model.name, status=Status.ERROR, seconds=seconds, findings=(finding,))


def run_model(manifest: Manifest, model: ModelSpec, debug: bool = False) -> ModelResult:
    # Imported here: the capture and verify stages are heavy and load only when a model runs.
    from equivci.capture.run import capture_model
    from equivci.verify.engine import verify_model

    t0 = time.perf_counter()
    try:
        captured = capture_model(model, manifest, debug=debug)
        result = verify_model(model, manifest, captured)
    except EquivciError as err:
        return _error_result(model, manifest_display_path(manifest), str(err), time.perf_counter() - t0)
    except Exception as exc:
        if debug:
            raise
        message = (
            f"internal error while checking model '{model.name}': {type(exc).__name__}: {exc}. "
            "This is a bug in equivci; rerun with --debug for the traceback and report it."
        )
        return _error_result(model, None, message, time.perf_counter() - t0)
    # Wall time of the whole model (capture included), which is what the user waits for.
    return dataclasses.replace(result, seconds=time.perf_counter() - t0)


def run_models(manifest: Manifest, models: list[ModelSpec], progress: Progress, debug: bool = False) -> Report:
    results = []
    for model in models:
        progress.started(model.name)
        result = run_model(manifest, model, debug)
        progress.finished(result)
        results.append(result)
    return Report(models=tuple(results))
