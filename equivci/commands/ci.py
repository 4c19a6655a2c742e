"""`equivci ci`: verify in GitHub Actions and report on the run and the pull request.

Reads only the standard Actions environment (GITHUB_EVENT_PATH, GITHUB_EVENT_NAME, GITHUB_REPOSITORY,
GITHUB_API_URL, GITHUB_TOKEN, GITHUB_STEP_SUMMARY, GITHUB_OUTPUT, RUNNER_TEMP), so it runs unchanged
on github.com, GitHub Enterprise Server and against a stand-in server. Outside Actions it still
verifies, prints the report and writes the report files.

On a pull_request event: one sticky summary comment (edited in place on reruns), a review whose line
comments sit on lines inside the PR diff, annotations, the job summary and the step outputs. With a
read-only token (pull requests from forks) it falls back to annotations and the job summary.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from equivci.ci import publish
from equivci.ci.event import ActionsContext, load_context
from equivci.ci.github import (
    GitHubClient,
    GitHubError,
    create_review,
    edit_review_comment,
    pull_files,
    review_comment_bodies,
    upsert_comment,
)
from equivci.commands.folders import require_folder
from equivci.commands.verify import (
    CaptureTimeoutOption,
    DebugOption,
    ManifestOption,
    with_capture_timeout,
)
from equivci.errors import EquivciError
from equivci.git import DiffLines, from_pull_files, pr_diff_lines, repo_root
from equivci.manifest import Manifest, load_manifest
from equivci.pipeline import manifest_display_path, run_models, select_models
from equivci.report import markdown, sarif
from equivci.report.json_report import report_to_dict
from equivci.report.text import RunProgress, write_text
from equivci.results import Report

READ_ONLY_NOTE = (
    "The GitHub token cannot write to this pull request ({why}), as happens for pull requests from "
    "forks: equivci reported through workflow annotations and the job summary only."
)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_pipeline(manifest: Manifest, models: list, *, changed_since: str | None, no_cache: bool, debug: bool) -> Report:
    with RunProgress(len(models)) as progress, contextlib.redirect_stdout(sys.stderr):
        return run_models(manifest, models, progress, debug=debug, changed_since=changed_since, no_cache=no_cache)


def _repo_paths(manifest: Manifest) -> tuple[Path, str]:
    return repo_root(manifest.root), manifest_display_path(manifest)


def _default_report_dir(ctx: ActionsContext) -> Path:
    if ctx.runner_temp is not None:
        return ctx.runner_temp / "equivci-report"
    return Path(".equivci/report")


def write_report_files(
    report: Report, folder: Path, repo_root: Path, manifest_rel: str, link_base: str | None
) -> dict[str, str]:
    """equivci.json, equivci.sarif and equivci.md in `folder`: their paths, or none of them (with a
    warning) when the folder cannot be written; the verdict does not depend on them."""
    files = {
        "json": (folder / "equivci.json", lambda: json.dumps(report_to_dict(report), indent=2) + "\n"),
        "sarif": (folder / "equivci.sarif", lambda: sarif.render(report, repo_root, manifest_rel)),
        "markdown": (folder / "equivci.md", lambda: markdown.render(report, repo_root, link_base=link_base)),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, render in files.values():
            path.write_text(render(), encoding="utf-8")
    except OSError as exc:
        _log(
            f"equivci: warning: cannot write the report files to {folder} ({exc.strerror or exc}); the run's verdict is unchanged."
        )
        return {}
    return {k: str(path) for k, (path, _) in files.items()}


def pr_diff(ctx: ActionsContext, client: GitHubClient | None, repo_root: Path) -> DiffLines | None:
    """Lines in the PR diff: from the local git history, else from the pulls/files API."""
    pr = ctx.pull_request
    assert pr is not None
    lines = pr_diff_lines(repo_root, pr.base_sha, pr.head_sha, log=_log)
    if lines is not None:
        return lines
    _log(f"equivci: git cannot diff {pr.base_sha[:12]}...{pr.head_sha[:12]} here; using the pull request files API")
    if client is None or not ctx.repository:
        return None
    try:
        return from_pull_files(pull_files(client, ctx.repository, pr.number))
    except GitHubError as exc:
        _log(f"equivci: cannot list the pull request files: {exc}")
        return None


def publish_pull_request(
    ctx: ActionsContext, report: Report, repo_root: Path, client: GitHubClient | None
) -> tuple[list[str], bool]:
    """Review and sticky comment. Returns (notes for the job summary, whether GitHub was written to)."""
    pr = ctx.pull_request
    assert pr is not None
    if client is None or not ctx.token:
        return [
            "No GitHub token was given (GITHUB_TOKEN): equivci reported through workflow annotations and the job summary only."
        ], False
    if not ctx.repository:
        return ["GITHUB_REPOSITORY is not set: equivci cannot comment on the pull request."], False
    repo = ctx.repository
    link_base = ctx.blob_url()
    diff = pr_diff(ctx, client, repo_root)
    notes: list[str] = []
    if diff is None:
        comments: list[publish.ReviewComment] = []
        outside = publish.ordered_findings(report)
        notes.append(
            "The pull request diff could not be read, so every finding is listed here instead of as a line comment."
        )
    else:
        comments, outside = publish.split_review(report, diff)

    in_review = 0
    try:
        existing = review_comment_bodies(client, repo, pr.number)
        _mark_fixed(client, repo, report, existing, pr.head_sha)
        if comments:
            fresh = publish.new_review_comments(comments, [c.get("body") or "" for c in existing])
            if fresh:
                create_review(
                    client,
                    repo,
                    pr.number,
                    pr.head_sha,
                    publish.review_body(report, len(fresh)),
                    [c.payload() for c in fresh],
                )
                _log(f"equivci: posted a review with {len(fresh)} line comment(s)")
            else:
                _log("equivci: every line comment was already posted by an earlier run")
            in_review = sum(c.findings for c in comments)
    except GitHubError as exc:
        if exc.forbidden:
            return [READ_ONLY_NOTE.format(why=f"HTTP 403: {exc.message}")], False
        # 422: a line GitHub does not consider part of the diff. Keep every finding in the summary.
        outside = publish.ordered_findings(report)
        notes.append(f"GitHub refused the line comments ({exc.message}); every finding is listed here.")
        _log(f"equivci: review not posted: {exc}")

    body = publish.summary_comment(
        report, outside, in_review=in_review, notes=notes, link_base=link_base, run_url=ctx.run_url
    )
    try:
        # A pull request that touches no model gets no new comment; an earlier one is still updated.
        action, comment = upsert_comment(client, repo, pr.number, publish.MARKER, body, create=bool(report.models))
    except GitHubError as exc:
        if exc.forbidden:
            return [READ_ONLY_NOTE.format(why=f"HTTP 403: {exc.message}")], False
        _log(f"equivci: could not write the summary comment: {exc}")
        return notes + [f"The summary comment could not be written ({exc})."], False
    if action == "skipped":
        _log("equivci: no model is affected by this pull request; no summary comment")
        return notes, False
    _log(f"equivci: {action} the summary comment {(comment or {}).get('html_url') or ''}".rstrip())
    return notes, True


def _mark_fixed(client: GitHubClient, repo: str, report: Report, existing: list[dict], sha: str) -> None:
    """Edit earlier line comments whose finding is gone into a "fixed" note (the REST API cannot
    resolve a review thread). A refusal other than a read-only token costs the note only."""
    for comment in publish.fixed_review_comments(report, existing):
        try:
            edit_review_comment(client, repo, comment["id"], publish.fixed_body(comment.get("body") or "", sha))
            _log(f"equivci: marked line comment {comment['id']} ({comment.get('path')}:{comment.get('line')}) fixed")
        except GitHubError as exc:
            if exc.forbidden:
                raise
            _log(f"equivci: could not mark line comment {comment['id']} fixed: {exc}")


def _append(path: Path | None, text: str, what: str) -> None:
    """Append to a file GitHub Actions reads ($GITHUB_STEP_SUMMARY, $GITHUB_OUTPUT). A channel that
    cannot be written is a warning: the verdict is the exit code, whatever the channels do."""
    if path is None:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        _log(f"equivci: warning: cannot write {what}={path} ({exc.strerror or exc}); the run's verdict is unchanged.")


def ci(
    manifest: ManifestOption = Path("equivci.yaml"),
    model: Annotated[list[str], typer.Option("--model", help="Verify only this model (repeatable).")] = [],
    tag: Annotated[list[str], typer.Option("--tag", help="Verify only models with this tag (repeatable).")] = [],
    all_models: Annotated[
        bool, typer.Option("--all", help="Verify every selected model, whatever the pull request changed.")
    ] = False,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Trust no memoized result: verify everything anew.")
    ] = False,
    changed_since: Annotated[
        str | None,
        typer.Option(
            "--changed-since", help="Git ref whose changes select the models (default on a pull request: its base)."
        ),
    ] = None,
    report_dir: Annotated[
        Path | None,
        typer.Option(
            "--report-dir",
            help="Folder for equivci.json, equivci.sarif and equivci.md (default: $RUNNER_TEMP/equivci-report).",
        ),
    ] = None,
    comment: Annotated[
        bool,
        typer.Option("--comment/--no-comment", help="Comment and review on the pull request (when the token allows)."),
    ] = True,
    capture_timeout: CaptureTimeoutOption = None,
    debug: DebugOption = False,
) -> None:
    """Verify in GitHub Actions: PR comment and review, annotations, job summary, outputs, SARIF."""
    ctx = load_context()
    folder = report_dir or _default_report_dir(ctx)
    if report_dir is not None:  # the default folder is an output channel: trouble there is a warning
        require_folder("--report-dir", report_dir, ", or leave the option out for $RUNNER_TEMP/equivci-report")
    try:
        loaded = load_manifest(manifest)
        models = with_capture_timeout(select_models(loaded, model, tag), capture_timeout)
    except EquivciError as err:
        file = publish.escape_property(str(manifest))
        title = publish.escape_property("equivci: manifest error")
        print(f"::error file={file},title={title}::{publish.escape_data(str(err))}", flush=True)
        _append(
            ctx.step_summary, f"### 🛑 equivci: manifest error\n\n{markdown.escape(str(err))}\n", "GITHUB_STEP_SUMMARY"
        )
        _append(ctx.output, publish.format_outputs({"status": "error"}), "GITHUB_OUTPUT")
        raise

    pr = ctx.pull_request
    base = changed_since or (pr.base_sha if pr is not None and not all_models else None)
    if base:
        _log(
            f"equivci: pull request #{pr.number}: checking changes since {base[:12]}"
            if pr and not changed_since
            else f"equivci: checking changes since {base}"
        )
    report = run_pipeline(loaded, models, changed_since=base, no_cache=no_cache, debug=debug)

    repo_root, manifest_rel = _repo_paths(loaded)
    link_base = ctx.blob_url()
    files = write_report_files(report, folder, repo_root, manifest_rel, link_base)

    notes: list[str] = []
    if pr is not None and comment:
        client = GitHubClient(ctx.api_url, ctx.token, log=_log) if ctx.token else None
        notes, _wrote = publish_pull_request(ctx, report, repo_root, client)
    elif ctx.in_actions and pr is None:
        _log(f"equivci: {ctx.event_name} event: no pull request to comment on")

    # The run log: the report, then annotations (workflow commands on stdout).
    write_text(report, sys.stdout)
    lines, _dropped = publish.annotations(report)
    for line in lines:
        print(line)
    for note in notes:
        print(f"::warning title=equivci::{publish.escape_data(note)}")
    sys.stdout.flush()

    summary = markdown.render(report, repo_root, link_base=link_base)
    if notes:
        summary += "\n" + "\n".join(f"> {note}\n" for note in notes)
    full = f"`{files['markdown']}`" if files else "the run log"
    where = f"{full} (in the folder the step output `report-dir` names)" if files else full
    summary = publish.truncate(
        summary,
        publish.SUMMARY_LIMIT,
        f"The report was cut at GitHub's job summary size limit; {where} has all of it.",
        size=publish.utf8_size,
    )
    _append(ctx.step_summary, summary, "GITHUB_STEP_SUMMARY")
    paths = {
        "sarif": files.get("sarif"),
        "json": files.get("json"),
        "markdown": files.get("markdown"),
        "report_dir": str(folder) if files else None,
    }
    _append(ctx.output, publish.format_outputs(publish.outputs(report, **paths)), "GITHUB_OUTPUT")
    raise typer.Exit(report.exit_code())


def register(app: typer.Typer) -> None:
    app.command("ci")(ci)
