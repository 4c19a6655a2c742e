"""What the localizer reads off an op: its frames in the user's code, and which ops only move data."""

from __future__ import annotations

from pathlib import Path

from equivci.hlo.ir import Instruction, SourceLoc

# Ops that hand a value on (or make one from nothing) without computing on it.
TRIVIAL_OPS = {"parameter", "copy", "tuple", "get-tuple-element", "call", "opt-barrier", "custom-call", "bitcast",
               "constant", "partition-id", "replica-id", "iota"}
LAYOUT_OPS = {"reshape", "broadcast", "transpose", "convert"}
_PACKAGE = str(Path(__file__).resolve().parents[1]) + "/"  # equivci's own frames (the capture child)


def is_user_frame(loc: SourceLoc) -> bool:
    return "site-packages" not in loc.file and not loc.file.startswith("<") and not loc.file.startswith(_PACKAGE)


def user_frames(inst: Instruction) -> list[SourceLoc]:
    """The op's stack inside the user's code, innermost first."""
    return [loc for loc in inst.stack if is_user_frame(loc)]


def innermost(inst: Instruction) -> tuple[str, int] | None:
    """(file, line) of the innermost frame of `inst` in the user's code."""
    return next(((loc.file, loc.line) for loc in inst.stack if is_user_frame(loc)), None)
