"""`--format markdown`: the report as GitHub-flavored markdown (job summary, PR comment, files).

`render(report, repo_root)` is the whole document; the pieces (`status_table`, `finding_lines`) are
reused by the pull-request summary comment.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

from equivci.results import SEVERITY_ORDER, Finding, ModelResult, Report, Status

ICON = {
    Status.VERIFIED: "✅",
    Status.MISMATCH: "❌",
    Status.UNPROVEN: "⚠️",
    Status.ERROR: "🛑",
}


def overall_status(report: Report) -> Status | None:
    """The worst status of the run (None when no model was selected)."""
    present = {m.status for m in report.models}
    return next((s for s in SEVERITY_ORDER if s in present), None)


def counts(report: Report) -> dict[Status, int]:
    return {s: sum(1 for m in report.models if m.status is s) for s in Status}


def headline(report: Report) -> str:
    n = len(report.models)
    if n == 0:
        return "equivci: no model selected"
    parts = [f"{c} {s.value}" for s, c in counts(report).items() if c]
    status = overall_status(report)
    icon = ICON[status] if status else ""
    noun = "model" if n == 1 else "models"
    return f"{icon} equivci: {n} {noun}: {', '.join(parts)}".strip()


def escape(text: str) -> str:
    """Inline-safe markdown: HTML-escaped, table pipes escaped, one line."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def location_md(f: Finding, link_base: str | None = None) -> str:
    if f.path is None:
        return ""
    loc = f.location()
    if link_base:
        anchor = f"#L{f.line}" if f.line else ""
        return f"[`{loc}`]({link_base}/{quote(f.path, safe='/')}{anchor})"
    return f"`{loc}`"


def finding_line(model: ModelResult, f: Finding, link_base: str | None = None, with_model: bool = False) -> str:
    where = location_md(f, link_base)
    head = f"**{escape(model.name)}** " if with_model else ""
    extra = []
    if f.layer:
        extra.append(f"layer `{escape(f.layer)}`")
    if f.op:
        extra.append(f"op `{escape(f.op)}`")
    tail = f" ({', '.join(extra)})" if extra else ""
    sep = ": " if where else ""
    return f"- {head}{where}{sep}{escape(f.message)}{tail}"


def status_table(report: Report) -> list[str]:
    lines = ["| model | status | layers verified | reused | time |", "| --- | --- | --- | --- | --- |"]
    for m in report.models:
        layers = f"{m.layers.verified}/{m.layers.total}" if m.layers.total else "–"
        reused = str(m.layers.reused) if m.layers.total else "–"
        note = " (unchanged, from cache)" if m.reused else ""
        if m.status is Status.VERIFIED and any(f.severity == "note" for f in m.findings):
            # a proof that rests on an input assumption must not read as an unconditional one
            note += ", assuming the inputs its note names"
        lines.append(
            f"| {escape(m.name)} | {ICON[m.status]} {m.status.value}{note} | {layers} | {reused} | {m.seconds:.1f} s |"
        )
    return lines


def finding_sections(items: Iterable[tuple[ModelResult, Finding]], link_base: str | None = None) -> list[str]:
    """Findings grouped by model, in the given order."""
    lines: list[str] = []
    current: str | None = None
    for model, f in items:
        if model.name != current:
            if lines:
                lines.append("")
            lines.append(f"#### {ICON[model.status]} {escape(model.name)}: {model.status.value}")
            lines.append("")
            current = model.name
        lines.append(finding_line(model, f, link_base))
    return lines


def render(report: Report, repo_root: str | Path | None = None, *, link_base: str | None = None) -> str:
    """The whole report. Paths in findings are already relative to the repository root; with
    `link_base` (e.g. https://github.com/OWNER/REPO/blob/SHA) locations become links."""
    del repo_root  # paths are repository-relative already; kept for a uniform render() signature
    lines = [f"### {headline(report)}", ""]
    if not report.models:
        lines.append("No model was selected: nothing to verify.")
        return "\n".join(lines) + "\n"
    lines += status_table(report)
    items = [(m, f) for m in report.models for f in m.findings]
    if items:
        lines += ["", "#### Findings" if len(report.models) == 1 else "#### Findings by model", ""]
        lines += finding_sections(items, link_base)
    lines.append("")
    return "\n".join(lines)
