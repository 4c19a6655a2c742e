"""What equivci says on GitHub, as pure functions of a Report (no I/O here).

- `summary_comment`: the one sticky comment, found again by MARKER and edited in place on reruns.
- `split_review`: review (line) comments on lines inside the PR diff; every other finding goes to
  the summary comment, since GitHub rejects a whole review that has one line outside the diff.
- `fixed_review_comments`: line comments of earlier runs whose finding this run no longer reports
  (they get edited into a "fixed" note, since the REST API cannot resolve a thread).
- `annotations`: `::error file=,line=,title=::` workflow commands, worst first, within what GitHub
  shows (10 per type per step, 50 per job), then one notice "+N more, see the job summary".
- `truncate`: bodies within GitHub's limits (a comment holds 65536 characters, a job summary 1 MiB),
  cut at a line with a pointer to the full report.
- `outputs`: the step outputs (status, counts, paths).
"""

import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

from equivci.git import DiffLines
from equivci.report import markdown as md
from equivci.results import SEVERITY_ORDER, Finding, ModelResult, Report, Status

MARKER = "<!-- equivci:summary -->"
FINDING_MARKER = "<!-- equivci:finding {key} model={model} -->"
_FINDING_MARKER_RE = re.compile(r"<!-- equivci:finding (\w+)(?: model=([A-Za-z0-9_.-]+))? -->")
FIXED_MARKER = "<!-- equivci:fixed -->"
ANNOTATION_LIMIT = 10  # what GitHub shows per type (error, warning, notice) and per step
JOB_ANNOTATION_LIMIT = 50  # and per job
COMMENT_LIMIT = 65536  # characters in an issue or review comment body
SUMMARY_LIMIT = 1024 * 1024  # bytes in one step's job summary
_SEVERITY_RANK = {"error": 0, "warning": 1, "note": 2}
_STATUS_RANK = {s: i for i, s in enumerate(SEVERITY_ORDER)}
_COMMAND = {"error": "error", "warning": "warning", "note": "notice"}


def ordered_findings(report: Report) -> list[tuple[ModelResult, Finding]]:
    """All findings, worst first: severity, then the model's status, then manifest and program order."""
    items = [(i, j, m, f) for i, m in enumerate(report.models) for j, f in enumerate(m.findings)]
    items.sort(key=lambda t: (_SEVERITY_RANK.get(t[3].severity, 3), _STATUS_RANK[t[2].status], t[0], t[1]))
    return [(m, f) for _, _, m, f in items]


def finding_key(model: ModelResult, f: Finding) -> str:
    """Stable id of a finding (model, place, message): reruns recognize what they already posted."""
    raw = "\0".join([model.name, f.path or "", str(f.line or ""), f.message])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


# --- review comments ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReviewComment:
    path: str
    line: int
    body: str
    key: str
    findings: int = 1  # findings gathered in this comment

    def payload(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "side": "RIGHT", "body": self.body}


def _review_body(items: list[tuple[ModelResult, Finding]], key: str) -> str:
    model_name = items[0][0].name
    lines: list[str] = []
    for model, f in items:
        status = f"{md.ICON[model.status]} **equivci** · `{md.escape(model.name)}` is **{model.status.value}**"
        if not lines:
            lines.append(status)
            lines.append("")
        context = f" (layer `{md.escape(f.layer)}`)" if f.layer else ""
        lines.append(f"- {md.escape(f.message)}{context}")
    lines.append("")
    lines.append(FINDING_MARKER.format(key=key, model=model_name))
    return truncate(
        "\n".join(lines),
        COMMENT_LIMIT,
        "this comment was cut at GitHub's size limit; the job summary has every finding.",
    )


def _line_groups(report: Report, keep: Callable[[Finding], bool]) -> tuple[dict, list[tuple[ModelResult, Finding]]]:
    """Findings with a line that `keep` accepts, grouped by (model, path, line); and the others."""
    grouped: dict[tuple[str, str, int], list[tuple[ModelResult, Finding]]] = {}
    others: list[tuple[ModelResult, Finding]] = []
    for model, f in ordered_findings(report):
        if f.path is not None and f.line is not None and keep(f):
            grouped.setdefault((model.name, f.path, f.line), []).append((model, f))
        else:
            others.append((model, f))
    return grouped, others


def _group_key(items: list[tuple[ModelResult, Finding]]) -> str:
    return hashlib.sha256("\0".join(finding_key(m, f) for m, f in items).encode()).hexdigest()[:16]


def split_review(report: Report, diff: DiffLines) -> tuple[list[ReviewComment], list[tuple[ModelResult, Finding]]]:
    """(comments on lines inside the diff, findings that go to the summary comment instead).

    Findings of one model on the same line share one comment.
    """
    grouped, outside = _line_groups(report, lambda f: diff.in_diff(f.path, f.line))
    comments = []
    for (_, path, line), items in grouped.items():
        key = _group_key(items)
        comments.append(
            ReviewComment(path=path, line=line, body=_review_body(items, key), key=key, findings=len(items))
        )
    return comments, outside


def _posted_keys(bodies: Iterable[str]) -> set[str]:
    return {m.group(1) for body in bodies if FIXED_MARKER not in body for m in _FINDING_MARKER_RE.finditer(body)}


def new_review_comments(comments: list[ReviewComment], existing_bodies: Iterable[str]) -> list[ReviewComment]:
    """Drop comments already posted by an earlier run (same finding marker, not since marked
    fixed), so reruns add nothing twice."""
    posted = _posted_keys(existing_bodies)
    return [c for c in comments if c.key not in posted]


def fixed_review_comments(report: Report, existing: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """equivci's line comments from earlier runs whose finding this run no longer reports, for
    models this run checked (verified, mismatch or unproven: a model that failed to capture, or was
    not selected, says nothing about its old findings)."""
    checked = {m.name for m in report.models if m.status is not Status.ERROR}
    current = {_group_key(items) for items in _line_groups(report, lambda f: True)[0].values()}
    fixed = []
    for comment in existing:
        body = comment.get("body") or ""
        m = _FINDING_MARKER_RE.search(body)
        if m and FIXED_MARKER not in body and m.group(2) in checked and m.group(1) not in current:
            fixed.append(comment)
    return fixed


def fixed_body(body: str, sha: str | None) -> str:
    """An earlier line comment, marked fixed (its finding stays readable, folded)."""
    at = f" at {sha[:12]}" if sha else ""
    head = f"✅ **Fixed**{at}: equivci no longer reports this.\n\n<details><summary>Earlier finding</summary>\n\n"
    tail = f"\n\n</details>\n{FIXED_MARKER}"
    return head + truncate(body, COMMENT_LIMIT - len(head) - len(tail), "cut at GitHub's size limit.") + tail


def review_body(report: Report, n_comments: int) -> str:
    noun = "comment" if n_comments == 1 else "comments"
    return f"{md.headline(report)} — {n_comments} line {noun} below; the summary comment has the full report."


# --- the sticky summary comment -------------------------------------------------------------------


def summary_comment(
    report: Report,
    outside: list[tuple[ModelResult, Finding]] | None = None,
    *,
    in_review: int = 0,
    notes: Iterable[str] = (),
    link_base: str | None = None,
    run_url: str | None = None,
) -> str:
    """The sticky comment: MARKER, status table, findings not shown as line comments, notes.

    `in_review` is the number of findings shown as review line comments instead."""
    lines = [MARKER, f"### {md.headline(report)}", ""]
    if report.models:
        lines += md.status_table(report)
    else:
        lines.append("No model is affected by this pull request: nothing to verify.")
    outside = ordered_findings(report) if outside is None else outside
    if outside:
        title = "Findings outside this pull request's diff" if in_review else "Findings"
        lines += ["", f"#### {title}", ""]
        lines += [md.finding_line(m, f, link_base, with_model=True) for m, f in outside]
    if in_review:
        noun = "finding is" if in_review == 1 else "findings are"
        lines += ["", f"{in_review} {noun} shown as review comments on the lines of this pull request."]
    for note in notes:
        lines += ["", f"> {note}"]
    footer = ["", f"<sub>[workflow run]({run_url}) · equivci</sub>", ""] if run_url else [""]
    where = f"the [job summary]({run_url})" if run_url else "the job summary"
    body = truncate(
        "\n".join(lines),
        COMMENT_LIMIT - len("\n".join(footer)),
        f"The report was cut at GitHub's comment size limit; {where} and the `equivci.md` report file have all of it.",
    )
    return body + "\n".join(footer)


def truncate(text: str, limit: int, pointer: str, size: Callable[[str], int] = len) -> str:
    """`text` if `size(text) <= limit`, else its first lines and `pointer`, within `limit`."""
    if size(text) <= limit:
        return text
    tail = f"\n\n> ✂️ {pointer}\n"
    budget, used, kept = limit - size(tail), 0, []
    for line in text.splitlines(keepends=True):
        used += size(line)
        if used > budget:
            break
        kept.append(line)
    return "".join(kept) + tail


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


# --- workflow annotations -------------------------------------------------------------------------


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(model: ModelResult, f: Finding) -> str:
    command = _COMMAND.get(f.severity, "warning")
    props = []
    if f.path is not None:
        props.append(f"file={escape_property(f.path)}")
        if f.line:
            props.append(f"line={f.line}")
    title = f"equivci: {model.name} is {model.status.value}"
    if f.layer:
        title += f" ({f.layer})"
    props.append(f"title={escape_property(title)}")
    return f"::{command} {','.join(props)}::{escape_data(f.message)}"


def annotations(
    report: Report, limit: int = ANNOTATION_LIMIT, job_limit: int = JOB_ANNOTATION_LIMIT
) -> tuple[list[str], int]:
    """Workflow-command lines, worst first: at most `limit` per type and `job_limit` in all, and
    when any finding is left out, a last notice "+N more" counted within both; and how many
    findings were left out."""
    # A model that failed without any finding still deserves one error line.
    entries = [
        (
            _SEVERITY_RANK.get(f.severity, 3),
            _STATUS_RANK[m.status],
            i,
            j,
            _COMMAND.get(f.severity, "warning"),
            annotation(m, f),
        )
        for i, m in enumerate(report.models)
        for j, f in enumerate(m.findings)
    ]
    for i, m in enumerate(report.models):
        if m.status is not Status.VERIFIED and not m.findings:
            title = escape_property(f"equivci: {m.name} is {m.status.value}")
            entries.append(
                (
                    0,
                    _STATUS_RANK[m.status],
                    i,
                    -1,
                    "error",
                    f"::error title={title}::{escape_data(f'{m.name} is {m.status.value}')}",
                )
            )
    entries.sort(key=lambda e: e[:4])
    used = {"error": 0, "warning": 0, "notice": 0}
    kept: list[tuple[str, str]] = []
    for *_, command, line in entries:
        if used[command] < limit and len(kept) < job_limit:
            used[command] += 1
            kept.append((command, line))
    dropped = len(entries) - len(kept)
    if dropped and (used["notice"] >= limit or len(kept) >= job_limit):  # room for the "+N more" notice
        last = max(i for i, (command, _) in enumerate(kept) if command == "notice" or len(kept) >= job_limit)
        del kept[last]
        dropped += 1
    lines = [line for _, line in kept]
    if dropped:
        noun = "finding is" if dropped == 1 else "findings are"
        lines.append(
            f"::notice title=equivci::+{dropped} more: {dropped} {noun} not annotated "
            f"(GitHub shows {limit} per type per step); see the job summary."
        )
    return lines, dropped


# --- step outputs ---------------------------------------------------------------------------------


def outputs(report: Report, **paths: str | None) -> dict[str, str]:
    status = md.overall_status(report)
    out = {
        "status": status.value if status else "none",
        "models": str(len(report.models)),
        **{s.value: str(n) for s, n in md.counts(report).items()},
        "findings": str(sum(len(m.findings) for m in report.models)),
    }
    for name, value in paths.items():
        if value is not None:
            out[name.replace("_", "-")] = value
    return out


def format_outputs(values: dict[str, str]) -> str:
    """$GITHUB_OUTPUT lines; multi-line values use the heredoc form with a unique delimiter."""
    lines = []
    for key, value in values.items():
        if "\n" in value:
            delim = "EQUIVCI_" + hashlib.sha256(value.encode()).hexdigest()[:12]
            lines += [f"{key}<<{delim}", value, delim]
        else:
            lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"
