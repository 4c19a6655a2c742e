"""Typed results passed from the verifier to the reporters (text, json, sarif, markdown, GitHub)."""

from __future__ import annotations

import dataclasses
import enum


class Status(str, enum.Enum):
    VERIFIED = "verified"
    MISMATCH = "mismatch"
    UNPROVEN = "unproven"
    ERROR = "error"


# Worst first: used to order annotations and to pick the overall status.
SEVERITY_ORDER = (Status.ERROR, Status.MISMATCH, Status.UNPROVEN, Status.VERIFIED)


@dataclasses.dataclass(frozen=True)
class Finding:
    path: str | None  # relative to the git repository root (manifest folder outside git)
    line: int | None
    severity: str  # "error" | "warning" | "note"
    layer: str | None
    message: str
    op: str | None = None  # HLO op name on the distributed side, for context
    changed: bool = False  # the line was changed since --changed-since REF
    # Findings of one model with the same `tie` are equally supported places for one cause; the
    # first is the error, the others notes, until a line the diff changed is put first.
    tie: int | None = None

    def location(self) -> str:
        if self.path is None:
            return "<unknown>"
        return f"{self.path}:{self.line}" if self.line else self.path


@dataclasses.dataclass(frozen=True)
class LayerCounts:
    total: int = 0
    verified: int = 0
    reused: int = 0


@dataclasses.dataclass(frozen=True)
class ModelResult:
    name: str
    status: Status
    seconds: float
    layers: LayerCounts = LayerCounts()
    findings: tuple[Finding, ...] = ()
    reused: bool = False  # whole model skipped by --changed-since and reported from the memo
    # Stopped by a limit of the run (the verifier's CPU time, wall time or memory), not decided by the
    # rules: never stored in the memo, since a rerun with a larger limit may decide it.
    limited: bool = False
    # (stage, seconds) of this model's run, for --timings (see equivci.timings); never stored.
    timings: tuple[tuple[str, float], ...] = dataclasses.field(default=(), compare=False)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The partition a `--shard I/N` run took its models from (see equivci.shard)."""

    index: int  # 1..count
    count: int
    selected: tuple[str, ...]  # every model selected before sharding, in manifest order
    assigned: tuple[str, ...]  # this shard's models
    balanced_by: str


@dataclasses.dataclass(frozen=True)
class Report:
    models: tuple[ModelResult, ...]
    shard: ShardPlan | None = None  # set by `verify --shard I/N`

    def exit_code(self) -> int:
        if any(m.status is Status.ERROR for m in self.models):
            return 2
        if any(m.status is not Status.VERIFIED for m in self.models):
            return 1
        return 0
