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


def in_repository(loc: SourceLoc, root: Path) -> bool:
    if not is_user_frame(loc):
        return False
    try:
        Path(loc.file).resolve().relative_to(root)
    except (OSError, ValueError):
        return False
    return True


def library_call(inst: Instruction, repo_root: str,
                 reference_lines: frozenset[tuple[str, int]]) -> tuple[SourceLoc, SourceLoc] | None:
    """For an op a third-party library made through code the reference runs too: (the repository's
    call into the library, the outermost repository frame on its stack that the reference does
    not run).

    JAX leaves its own frames out of an op's stack, so an innermost frame outside the repository
    is library code. When the repository's call into it is a line the reference runs as well (a
    shared adapter), neither differs; what the distributed program decides is how it reaches that
    adapter, written where its own call chain starts (the entrypoint that passes the configuration
    down). None when the op is the repository's own, or the call into the library is
    distributed-only (then that call is the place).
    """
    root = Path(repo_root).resolve()
    if not inst.stack or in_repository(inst.stack[0], root):
        return None
    ours = [loc for loc in inst.stack if in_repository(loc, root)]
    if not ours or (ours[0].file, ours[0].line) not in reference_lines:
        return None
    own = [loc for loc in ours if (loc.file, loc.line) not in reference_lines]
    if not own:
        return None
    return ours[0], own[-1]
