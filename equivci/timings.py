"""Where the wall time of a run goes, stage by stage (`equivci verify --timings`).

Each process times its own stages as consecutive laps, so the rows of a process add up to its
wall time and nothing falls between two stages. A row is (stage, seconds); a stage named
"capture/lower reference" is a part of "capture". The capture and verifier children send their
rows back with their answers; the CLI prints them on stderr, one block per run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import TextIO

Row = tuple[str, float]
CHILD_REST = "other (process start and exit, transfer)"
HEADER = "equivci: timings (wall seconds)"
ROW = re.compile(r"  ( *)(.+?) +(\d+\.\d{3})")  # a line of the table: indent, stage, seconds


class Laps:
    """Consecutive stages: each `lap(stage)` ends the stage that began at the previous lap (or at
    `start`, a time.perf_counter() value of this process)."""

    def __init__(self, start: float | None = None) -> None:
        self.rows: list[Row] = []
        self._last = time.perf_counter() if start is None else start

    def lap(self, stage: str, parts: Iterable[Row] = (), rest: str = CHILD_REST) -> None:
        """End `stage`. `parts`: its rows as measured inside it (by a child process), then a row
        `rest` for the time they leave out."""
        now = time.perf_counter()
        total = now - self._last
        self.rows.append((stage, total))
        parts = list(parts)
        self.rows.extend((f"{stage}/{name}", seconds) for name, seconds in parts)
        if parts:
            measured = sum(seconds for name, seconds in parts if "/" not in name)
            self.rows.append((f"{stage}/{rest}", max(0.0, total - measured)))
        self._last = now


def write(rows: Iterable[Row], out: TextIO) -> None:
    """The rows as a table with each part indented under its stage, in the order measured."""
    lines = [("  " * stage.count("/") + stage.rsplit("/", 1)[-1], seconds) for stage, seconds in rows]
    width = max((len(name) for name, _ in lines), default=0)
    out.write(HEADER + "\n")
    for name, seconds in lines:
        out.write(f"  {name:<{width}}  {seconds:7.3f}\n")
    out.flush()


def read(text: str) -> dict[str, float]:
    """The table `write` printed into `text` (stderr of a run), as {"stage/part/...": seconds}."""
    if HEADER not in text:
        return {}
    rows: dict[str, float] = {}
    path: list[str] = []
    for line in text[text.index(HEADER) + len(HEADER) :].splitlines()[1:]:
        m = ROW.fullmatch(line)
        if not m:
            break
        depth = len(m.group(1)) // 2
        path[depth:] = [m.group(2)]
        rows["/".join(path)] = float(m.group(3))
    return rows
