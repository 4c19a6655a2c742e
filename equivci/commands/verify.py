"""`equivci verify`: capture and verify the selected models, print the report, exit 0/1/2."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from equivci import shard as shard_mod
from equivci.errors import EquivciError
from equivci.git import repo_root
from equivci.manifest import ModelSpec, load_manifest
from equivci.pipeline import run_models, select_models
from equivci.report import markdown, sarif
from equivci.report.json_report import write_json
from equivci.report.text import RunProgress, write_text
from equivci.results import Report
from equivci.timings import Laps
from equivci.timings import write as write_timings


class ShardBy(str, enum.Enum):
    name = "name"
    cost = "cost"


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"


ManifestOption = Annotated[
    Path, typer.Option("--manifest", help="Manifest file; entrypoint paths are relative to its folder.")
]
DebugOption = Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors (yours and equivci's).")]
CaptureTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--capture-timeout",
        metavar="SECONDS",
        min=1,
        help="Stop importing, tracing and partitioning a model after this long (default: the model's "
        "capture_timeout in the manifest, else 900).",
    ),
]
TimingsOption = Annotated[
    bool, typer.Option("--timings", help="Print on stderr where the time went, stage by stage (capture, memo, verify).")
]


def verify(
    ctx: typer.Context,
    manifest: ManifestOption = Path("equivci.yaml"),
    model: Annotated[list[str], typer.Option("--model", help="Verify only this model (repeatable).")] = [],
    tag: Annotated[list[str], typer.Option("--tag", help="Verify only models with this tag (repeatable).")] = [],
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="Report format on stdout.")
    ] = OutputFormat.text,
    changed_since: Annotated[
        str | None,
        typer.Option(
            "--changed-since",
            metavar="REF",
            help="Verify only the models whose source files changed since this git ref; report the others from the cache.",
        ),
    ] = None,
    all_models: Annotated[
        bool, typer.Option("--all", help="Verify every selected model, even with --changed-since.")
    ] = False,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache", help="Neither read nor write the cache: verify everything anew (nightly: --all --no-cache)."
        ),
    ] = False,
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Cache folder (default: .equivci/cache at the repository root)."),
    ] = None,
    capture_timeout: CaptureTimeoutOption = None,
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            metavar="I/N",
            help="Verify only the I-th of N shares of the selected models (parallel jobs; join their JSON reports with `equivci merge`).",
        ),
    ] = None,
    shard_by: Annotated[
        ShardBy,
        typer.Option(
            "--shard-by", help="Balance the shards by model name (stable), or by the times recorded in the cache."
        ),
    ] = ShardBy.name,
    debug: DebugOption = False,
    timings: TimingsOption = False,
) -> None:
    """Prove each selected distributed entrypoint equivalent to its reference."""
    started = ctx.obj["started"]
    laps = Laps(started)
    laps.lap("start-up (imports, arguments)")
    as_json = output_format is OutputFormat.json
    try:
        loaded = load_manifest(manifest)
        models = with_capture_timeout(select_models(loaded, model, tag), capture_timeout)
        if shard is not None:
            models, plan = shard_mod.plan(
                shard, loaded, models, by_cost=shard_by is ShardBy.cost, no_cache=no_cache, cache_dir=cache_dir
            )
        # stdout carries the report only; anything else printed during the run goes to stderr.
        with RunProgress(len(models)) as progress, contextlib.redirect_stdout(sys.stderr):
            report = run_models(
                loaded,
                models,
                progress,
                debug=debug,
                changed_since=changed_since,
                no_cache=no_cache,
                cache_dir=cache_dir,
                all_models=all_models,
            )
    except EquivciError as err:
        if as_json:  # consumers of --format json always get a document to parse
            write_json(Report(models=()), sys.stdout, error=str(err))
        raise
    if shard is not None:
        report = dataclasses.replace(report, shard=plan)
    laps.lap("models", [row for result in report.models for row in _model_rows(result)], rest="other (manifest)")
    if as_json:
        write_json(report, sys.stdout)
    elif output_format is OutputFormat.text:
        write_text(report, sys.stdout)
    else:
        sys.stdout.write(_render_document(output_format, report, loaded))
    sys.stdout.flush()
    laps.lap("report")
    if timings:
        laps.rows.append(("total", time.perf_counter() - started))
        write_timings(laps.rows, sys.stderr)
    raise typer.Exit(report.exit_code())


def with_capture_timeout(models: list[ModelSpec], seconds: float | None) -> list[ModelSpec]:
    """--capture-timeout overrides each model's `capture_timeout`."""
    return models if seconds is None else [dataclasses.replace(m, capture_timeout=seconds) for m in models]


def _model_rows(result) -> list:
    return [(result.name, result.seconds)] + [(f"{result.name}/{stage}", s) for stage, s in result.timings]


def _render_document(output_format: OutputFormat, report: Report, manifest) -> str:
    root = repo_root(manifest.root)
    if output_format is OutputFormat.sarif:
        return sarif.render(report, root, manifest.path.resolve().relative_to(root).as_posix())
    return markdown.render(report, root)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
