"""`equivci merge`: join the JSON reports of `verify --shard I/N` jobs into one report, print it
in any report format (the pull-request comment included) or publish it on the pull request."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated

import typer

from equivci.ci import publish as publish_mod
from equivci.ci.event import load_context
from equivci.git import repo_root
from equivci.report import markdown
from equivci.report.json_report import write_json
from equivci.report.merge import merge as merge_reports
from equivci.report.text import write_text


class MergeFormat(str, enum.Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    comment = "comment"  # the sticky pull-request comment's body


def merge(
    reports: Annotated[
        list[Path],
        typer.Argument(metavar="REPORT.json", help="JSON reports of the shards (`verify --shard I/N --format json`)."),
    ],
    output_format: Annotated[
        MergeFormat, typer.Option("--format", help="Format of the merged report on stdout.")
    ] = MergeFormat.text,
    link_base: Annotated[
        str | None,
        typer.Option("--link-base", help="Make finding locations links: https://github.com/OWNER/REPO/blob/SHA."),
    ] = None,
    publish: Annotated[
        bool,
        typer.Option(
            "--publish",
            help="In GitHub Actions: the pull-request comment and review, and the job summary, as `equivci ci` writes them.",
        ),
    ] = False,
) -> None:
    """Merge the JSON reports of parallel runs into one report; exit 0/1/2 as `verify` would."""
    report = merge_reports(reports)
    if output_format is MergeFormat.json:
        write_json(report, sys.stdout)
    elif output_format is MergeFormat.text:
        write_text(report, sys.stdout)
    elif output_format is MergeFormat.markdown:
        sys.stdout.write(markdown.render(report, link_base=link_base))
    else:
        sys.stdout.write(publish_mod.summary_comment(report, link_base=link_base))
    sys.stdout.flush()
    if publish:
        _publish(report)
    raise typer.Exit(report.exit_code())


def _publish(report) -> None:
    # lazy: only with --publish: the GitHub client pulls HTTP modules, the ci command the pipeline (numpy)
    from equivci.ci.github import GitHubClient
    from equivci.commands.ci import _append, _log, publish_pull_request

    ctx = load_context()
    root = repo_root(Path.cwd())
    notes: list[str] = []
    if ctx.pull_request is not None:
        client = GitHubClient(ctx.api_url, ctx.token, log=_log) if ctx.token else None
        notes, _ = publish_pull_request(ctx, report, root, client)
    else:
        _log(f"equivci: {ctx.event_name or 'no'} event: no pull request to comment on")
    summary = markdown.render(report, root, link_base=ctx.blob_url())
    _append(ctx.step_summary, summary + "".join(f"\n> {note}\n" for note in notes), "GITHUB_STEP_SUMMARY")


def register(app: typer.Typer) -> None:
    app.command("merge")(merge)
