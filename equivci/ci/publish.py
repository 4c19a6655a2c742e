"""What equivci says on GitHub, as pure functions of a Report (no I/O here).

- `summary_comment`: the one sticky comment, found again by MARKER and edited in place on reruns.
- `split_review`: review (line) comments on lines inside the PR diff; every other finding goes to
  the summary comment, since GitHub rejects a whole review that has one line outside the diff.
- `annotations`: `::error file=,line=,title=::` workflow commands, worst first, within GitHub's
  per-step limits (10 errors, 10 warnings, 10 notices).
- `outputs`: the step outputs (status, counts, paths).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable

from equivci.git import DiffLines
from equivci.report import markdown as md
from equivci.results import SEVERITY_ORDER, Finding, ModelResult, Report, Status

MARKER = "<!-- equivci:summary -->"
FINDING_MARKER = "<!-- equivci:finding {key} -->"
ANNOTATION_LIMIT = 10  # per level and per step (GitHub also caps 50 per job)
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
    lines = []
    for model, f in items:
        status = f"{md.ICON[model.status]} **equivci** · `{md.escape(model.name)}` is **{model.status.value}**"
        if not lines:
            lines.append(status)
            lines.append("")
        context = f" (layer `{md.escape(f.layer)}`)" if f.layer else ""
        lines.append(f"- {md.escape(f.message)}{context}")
    lines.append("")
    lines.append(FINDING_MARKER.format(key=key))
    return "\n".join(lines)


def split_review(
    report: Report, diff: DiffLines
) -> tuple[list[ReviewComment], list[tuple[ModelResult, Finding]]]:
    """(comments on lines inside the diff, findings that go to the summary comment instead).

    Findings of one model on the same line share one comment.
    """
    grouped: dict[tuple[str, str, int], list[tuple[ModelResult, Finding]]] = {}
    outside: list[tuple[ModelResult, Finding]] = []
    for model, f in ordered_findings(report):
        if f.path is not None and f.line is not None and diff.in_diff(f.path, f.line):
            grouped.setdefault((model.name, f.path, f.line), []).append((model, f))
        else:
            outside.append((model, f))
    comments = []
    for (_, path, line), items in grouped.items():
        key = hashlib.sha256("\0".join(finding_key(m, f) for m, f in items).encode()).hexdigest()[:16]
        comments.append(ReviewComment(path=path, line=line, body=_review_body(items, key), key=key, findings=len(items)))
    return comments, outside


def new_review_comments(comments: list[ReviewComment], existing_bodies: Iterable[str]) -> list[ReviewComment]:
    """Drop comments already posted by an earlier run (same finding marker), so reruns add nothing twice."""
    posted = "\n".join(existing_bodies)
    return [c for c in comments if FINDING_MARKER.format(key=c.key) not in posted]


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
    if run_url:
        lines += ["", f"<sub>[workflow run]({run_url}) · equivci</sub>"]
    lines.append("")
    return "\n".join(lines)


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


def annotations(report: Report, limit: int = ANNOTATION_LIMIT) -> tuple[list[str], int]:
    """Workflow-command lines, worst first, at most `limit` per level; and how many were left out."""
    used = {"error": 0, "warning": 0, "notice": 0}
    lines: list[str] = []
    dropped = 0
    for model, f in ordered_findings(report):
        command = _COMMAND.get(f.severity, "warning")
        if used[command] >= limit:
            dropped += 1
            continue
        used[command] += 1
        lines.append(annotation(model, f))
    # A model that failed without any finding still deserves one error line.
    for model in report.models:
        if model.status is not Status.VERIFIED and not model.findings and used["error"] < limit:
            used["error"] += 1
            title = escape_property(f"equivci: {model.name} is {model.status.value}")
            lines.append(f"::error title={title}::{escape_data(f'{model.name} is {model.status.value}')}")
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
