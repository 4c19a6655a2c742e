"""What the localizer reads off an op: its frames in the user's code, and which ops only move data."""

from __future__ import annotations

from pathlib import Path

from equivci.hlo.ir import Instruction, SourceLoc

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


def library_call(
    inst: Instruction, repo_root: str, reference_lines: frozenset[tuple[str, int]]
) -> tuple[SourceLoc, SourceLoc, SourceLoc] | None:
    """For an op made while a shared adapter runs a library: (the adapter's frame, the library frame
    inside it, the outermost repository frame on the op's stack that the reference does not run).

    JAX leaves its own frames out of an op's stack, so a frame outside the repository (and outside
    equivci) is library code. When the op's stack passes through a repository line the reference
    runs as well (an adapter calling the library, which runs the same for both), what the
    distributed program decides is how it reaches that adapter: the arguments it passes down from
    where its own call chain starts. None when no shared adapter calls a library on the stack, or
    when every frame outside the adapter is the reference's too.
    """
    root = Path(repo_root).resolve()
    frames = list(inst.stack)
    for k, loc in enumerate(frames):
        if not in_repository(loc, root) or (loc.file, loc.line) not in reference_lines:
            continue
        library = next((f for f in frames[:k] if _is_library(f, root)), None)
        own = [f for f in frames[k + 1 :] if in_repository(f, root) and (f.file, f.line) not in reference_lines]
        if library is not None and own:
            return loc, library, own[-1]
        return None
    return None


def shared_call(
    inst: Instruction, repo_root: str, reference_lines: frozenset[tuple[str, int]]
) -> tuple[SourceLoc, SourceLoc] | None:
    """For an op made on a repository line the reference runs too (a helper both programs call):
    (that frame, the innermost repository frame above it that the reference does not run, where
    the distributed program calls into the shared code). Given the same operands the shared line
    computes what the reference's does, so the values it is handed decide; None otherwise."""
    root = Path(repo_root).resolve()
    frames = [f for f in inst.stack if in_repository(f, root)]
    if not frames or (frames[0].file, frames[0].line) not in reference_lines:
        return None
    caller = next((f for f in frames[1:] if (f.file, f.line) not in reference_lines), None)
    return (frames[0], caller) if caller is not None else None


def _is_library(loc: SourceLoc, root: Path) -> bool:
    return not in_repository(loc, root) and not loc.file.startswith(_PACKAGE) and not loc.file.startswith("<")
