"""The verify pipeline over the selected models: capture, then verify, one model at a time.

A failing model becomes an `error` result and the run goes on, so one broken entrypoint does not
hide the verdicts of the other models.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from pathlib import Path
from typing import Protocol

from equivci import git
from equivci.cache import Memo, file_digests, fingerprint, key
from equivci.capture import run as capture_run
from equivci.capture.types import CapturedModel
from equivci.diagnose.ranking import changed_first
from equivci.errors import EquivciError
from equivci.manifest import Manifest, ModelSpec
from equivci.options import Options
from equivci.results import Finding, LayerCounts, ModelResult, Report, Status
from equivci.timings import Laps
from equivci.verify.sandbox import verify_isolated
from equivci.workspace import Workspace, manifest_display_path  # noqa: F401 - manifest_display_path: for the commands


class Progress(Protocol):
    def started(self, name: str) -> None: ...

    def layer(self, name: str, done: int, total: int) -> None: ...

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
        raise EquivciError(
            f"{manifest.path.name}: no model is tagged {', '.join(repr(t) for t in missing)}; {defined}."
        )
    if not names and not tags:
        return list(manifest.models)
    return [m for m in manifest.models if m.name in names or set(m.tags) & set(tags)]


def _error_result(model: ModelSpec, path: str | None, message: str, seconds: float) -> ModelResult:
    finding = Finding(path=path, line=None, severity="error", layer=None, message=message)
    return ModelResult(name=model.name, status=Status.ERROR, seconds=seconds, findings=(finding,))


def run_model(workspace: Workspace, model: ModelSpec, memo: Memo, debug: bool = False, on_layer=None) -> ModelResult:
    """Capture and verify one model. A result stored in `memo` under the model's content key is
    reused (the capture child stops before compiling) and a new one is stored."""
    t0 = time.perf_counter()
    laps = Laps(t0)
    try:
        result = _run_memoized(workspace, model, debug, memo, laps, on_layer)
    except EquivciError as err:
        return _error_result(model, workspace.manifest_rel, str(err), time.perf_counter() - t0)
    except Exception as exc:
        if debug:
            raise
        message = (
            f"internal error while checking model '{model.name}': {getattr(exc, 'type_name', type(exc).__name__)}: "
            f"{exc.args[0] if exc.args else exc}. "
            "This is a bug in equivci; rerun with --debug for the traceback and report it."
        )
        return _error_result(model, None, message, time.perf_counter() - t0)
    # Wall time of the whole model (capture included), which is what the user waits for.
    return dataclasses.replace(result, seconds=time.perf_counter() - t0, timings=tuple(laps.rows))


def _capture(model: ModelSpec, manifest: Manifest, laps: Laps, **kwargs) -> CapturedModel:
    imported = []

    def prepare_verifier() -> None:
        # Importing the verifier (egglog, the rules) takes most of a second; done here while the
        # child compiles, the verifier child forked next inherits it. On failure that child
        # imports it again and reports the error as the model's result.
        t0 = time.perf_counter()
        try:
            importlib.import_module("equivci.verify.engine")  # lazy on purpose: egglog and the rules
        except Exception:  # noqa: BLE001 - reported by the verifier child
            return
        imported.append(("(meanwhile, in this process: import the verifier)", time.perf_counter() - t0))

    captured = capture_run.capture_model(model, manifest, on_compile=prepare_verifier, **kwargs)
    laps.lap("capture", captured.timings)
    laps.rows.extend((f"capture/{stage}", seconds) for stage, seconds in imported)  # overlapped: not a lap
    return captured


def _verify(
    workspace: Workspace, model: ModelSpec, captured: CapturedModel, laps: Laps, memo: Memo, on_layer=None
) -> ModelResult:
    result = verify_isolated(model, workspace.manifest, captured, memo, on_layer, workspace.options)
    laps.lap("verify", result.timings)
    return result


def _entrypoint_files(manifest: Manifest, model: ModelSpec, repo_root: Path) -> set[str]:
    """Repository-relative files of the model's entrypoints (FILE.py, or package.module under the
    manifest folder), or of an HLO model its HLO and relation files."""
    if model.hlo is not None:
        return {f.relative_to(repo_root).as_posix() for f in model.hlo.files() if f.is_relative_to(repo_root)}
    out = set()
    for ep in model.entrypoints():
        candidates = [Path(ep.file)] if ep.file is not None else []
        if ep.module:
            rel = Path(*ep.module.split("."))
            candidates += [manifest.root / rel.with_suffix(".py"), manifest.root / rel / "__init__.py"]
        for c in candidates:
            if c.is_file():
                try:
                    out.add(c.resolve().relative_to(repo_root).as_posix())
                except ValueError:
                    pass
                break
    return out


def _all_reused(result: ModelResult, name: str) -> ModelResult:
    """A stored result for model `name` (identical content may have been stored under another name)."""
    total = result.layers.total
    return dataclasses.replace(result, name=name, layers=LayerCounts(total, result.layers.verified, total))


def _verdict_fingerprint(workspace: Workspace) -> str:
    """What decides a verdict besides the model: the verifier (its source fingerprint, which covers
    the budgets in code) and the settings read from the environment (the saturation budgets)."""
    options = workspace.options
    return key(
        fingerprint(),
        f"saturation_iterations={options.saturation_iterations}",
        f"saturation_nodes={options.budgets.saturation_nodes}",
    )


def _run_memoized(
    workspace: Workspace, model: ModelSpec, debug: bool, memo: Memo, laps: Laps, on_layer=None
) -> ModelResult:
    manifest, repo_root = workspace.manifest, workspace.repo_root
    request = {
        "fingerprint": _verdict_fingerprint(workspace),
        "repo_root": str(repo_root),
        "cache_dir": str(memo.root) if memo.root is not None else None,
        "known": memo.known_results(),
    }
    laps.lap("memo: request (repository, fingerprint)")
    captured = _capture(model, manifest, laps, debug=debug, memo=request)
    result = memo.result(captured.content_key, captured.loc_digest) if captured.cached else None
    laps.lap("memo: lookup")
    if captured.cached and result is None:  # the entry vanished or broke since the child looked
        captured = _capture(model, manifest, laps, debug=debug, memo={**request, "cache_dir": None, "known": {}})
    if result is not None:
        result = _all_reused(result, model.name)
    else:
        result = _verify(workspace, model, captured, laps, memo, on_layer)
        if not result.limited:
            memo.put_result(captured.content_key, result, captured.loc_digest)
    manifest_rel = workspace.manifest_rel
    tracked = set(captured.sources) | _entrypoint_files(manifest, model, repo_root) | {manifest_rel}
    memo.record_capture(
        manifest_rel,
        model.name,
        {
            "key": captured.content_key,
            "loc_digest": captured.loc_digest,
            "fingerprint": _verdict_fingerprint(workspace),
            "sources": sorted(captured.sources),
            "digests": file_digests(repo_root, tracked),
        },
    )
    laps.lap("memo: record")
    return result


def _reuse_unchanged(workspace: Workspace, model: ModelSpec, memo: Memo, changes) -> ModelResult | None:
    """The model's last result, when nothing it depends on changed since REF and its files are
    byte-for-byte those of its last capture (so the result is that of the current code)."""
    manifest_rel, repo_root = workspace.manifest_rel, workspace.repo_root
    record = memo.last_capture(manifest_rel, model.name)
    if record is None or record.get("fingerprint") != _verdict_fingerprint(workspace):
        return None
    files = git.model_files(_entrypoint_files(workspace.manifest, model, repo_root), record["sources"], manifest_rel)
    if changes.touches(files):
        return None
    digests = record.get("digests") or {}
    if not files <= set(digests) or file_digests(repo_root, digests) != digests:
        return None
    result = memo.result(record.get("key", ""), record.get("loc_digest"))
    if result is None:
        return None
    return dataclasses.replace(_all_reused(result, model.name), reused=True)


def run_models(
    manifest: Manifest,
    models: list[ModelSpec],
    progress: Progress,
    debug: bool = False,
    changed_since: str | None = None,
    no_cache: bool = False,
    cache_dir: Path | None = None,
    all_models: bool = False,
) -> Report:
    """Verify `models`. The memo (under `cache_dir`, default .equivci/cache at the repository root)
    serves results whose content key is known; `no_cache` neither reads nor writes it (identical
    models within the run are still verified once). `changed_since`: models whose recorded sources,
    entrypoint files and manifest did not change since that git ref are reported from the memo
    (`reused`) without being captured, unless `all_models`; findings on changed lines are marked."""
    workspace = Workspace.of(manifest, Options.from_env())
    memo = Memo(None if no_cache else workspace.cache_dir(cache_dir))
    changes = git.changes_since(workspace.repo_root, changed_since) if changed_since else None
    results = []
    for model in models:
        progress.started(model.name)
        t0 = time.perf_counter()
        result = None
        if changes is not None and not all_models and not no_cache:
            result = _reuse_unchanged(workspace, model, memo, changes)
            if result is not None:
                seconds = time.perf_counter() - t0
                result = dataclasses.replace(
                    result, seconds=seconds, timings=(("unchanged since REF: from the memo", seconds),)
                )
        if result is None:
            result = run_model(
                workspace,
                model,
                memo,
                debug,
                on_layer=lambda done, total, name=model.name: progress.layer(name, done, total),
            )
        result = git.mark_changed(result, changes)
        result = dataclasses.replace(result, findings=changed_first(result.findings))
        progress.finished(result)
        results.append(result)
    return Report(models=tuple(results))
