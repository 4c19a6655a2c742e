"""Human output: the per-model report (stdout) and run progress (stderr).

On a terminal both use rich styling and a live progress bar; when output is piped or CI=true the
same information is written as plain, greppable lines.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

from equivci.results import ModelResult, Report, Status

STATUS_STYLE = {
    Status.VERIFIED: "bold green",
    Status.MISMATCH: "bold red",
    Status.UNPROVEN: "bold yellow",
    Status.ERROR: "bold red",
}


def _interactive(console: Console) -> bool:
    return console.is_terminal and os.environ.get("CI", "").lower() != "true"


def _console(out: TextIO) -> Console:
    # No wrapping, so `path:line: message` lines stay whole for tools and editors.
    console = Console(file=out, highlight=False, soft_wrap=True)
    if _interactive(console):
        return console
    # Plain mode (piped, or CI=true on a terminal): no colors, no cursor control.
    return Console(file=out, highlight=False, soft_wrap=True, color_system=None, force_terminal=False)


def _model_lines(m: ModelResult) -> list[Text]:
    head = Text()
    head.append(m.name, style="bold")
    head.append("  ")
    head.append(m.status.value, style=STATUS_STYLE[m.status])
    head.append(f"  {m.seconds:.1f} s")
    if m.layers.total > 1:  # a model without named layers is one layer: nothing to say
        head.append(f"  layers {m.layers.verified}/{m.layers.total} verified, {m.layers.reused} reused", style="dim")
    if m.reused:
        head.append("  (unchanged, from cache)", style="dim")
    lines = [head]
    for f in m.findings:
        line = Text("  ")
        if f.path is not None:
            line.append(f"{f.location()}: ", style="bold")
        # Continuation lines of multi-line messages stay under the finding.
        line.append(f.message.replace("\n", "\n    "), style="red" if f.severity == "error" else None)
        if f.layer:
            line.append(f"  [{f.layer}]", style="dim")
        lines.append(line)
    return lines


def summary_line(report: Report) -> Text:
    counts = {s: sum(1 for m in report.models if m.status is s) for s in Status}
    parts = [f"{n} {s.value}" for s, n in counts.items() if n]
    total = sum(m.seconds for m in report.models)
    n = len(report.models)
    text = Text(f"equivci: {n} model{'s' if n != 1 else ''}: ", style="bold")
    text.append(", ".join(parts) or "nothing selected")
    text.append(f" ({total:.1f} s)")
    return text


def write_text(report: Report, out: TextIO | None = None) -> None:
    console = _console(out or sys.stdout)
    for m in report.models:
        for line in _model_lines(m):
            console.print(line)
    console.print(summary_line(report))


# In logs, a line about layers at most this often (a 126-layer model would print 126 lines).
LAYER_LINE_SECONDS = 5.0


class RunProgress:
    """Progress of a run on stderr: a rich bar on a terminal, `equivci: [i/n] name: status (s)` lines otherwise."""

    def __init__(self, total: int, out: TextIO | None = None):
        self.total = total
        self.done = 0
        self.console = _console(out or sys.stderr)
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._last_line = time.monotonic()

    def __enter__(self) -> RunProgress:
        if _interactive(self.console):
            # lazy: logs and pipes (CI) have no live bar, so they do not import rich.progress
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("[bold]equivci[/]"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def started(self, name: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=f"{name}: capturing and verifying")

    def layer(self, name: str, done: int, total: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=f"{name}: layer {done}/{total}")
        elif time.monotonic() - self._last_line >= LAYER_LINE_SECONDS or done == total:
            self._last_line = time.monotonic()
            self.console.print(f"equivci:   {name}: layers {done}/{total}")

    def finished(self, result: ModelResult) -> None:
        self.done += 1
        line = Text(f"equivci: [{self.done}/{self.total}] {result.name}: ")
        line.append(result.status.value, style=STATUS_STYLE[result.status])
        line.append(f" ({result.seconds:.1f} s)")
        if self._bar is not None and self._task is not None:
            self._bar.console.print(line)  # printed above the live bar
            self._bar.advance(self._task)
        else:
            self.console.print(line)
