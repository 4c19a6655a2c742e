"""Where the distributed program's own code makes the value it hands a helper both programs run.

An op on a line the reference runs too computes, from the same operands, what the reference's op
there computes: when its value differs, the difference came in with an operand. Walking back from
it through ops made on such shared lines, and through ops that only hand a value on (a copy, a
called body's parameter, a shard_map's entry), reaches the ops the distributed program's own lines
make: one of those made what the shared code was handed. When they sit on one line, that line is
where the handed value is made. An op made inside a function that a frontier line calls (a
callback, a helper) is more specific than the line that calls it: the caller's line only combines
what the call returns.

An op whose operands are all inputs or values only handed on (the shared code reads an input the
distributed program passes as it is) has no such line: the call stays the suspect.
"""

from __future__ import annotations

from pathlib import Path

from equivci.diagnose.frames import in_repository
from equivci.hlo.ir import Instruction, SourceLoc
from equivci.terms.ir import Term
from equivci.translate.evaluator import Event

# Ops that hand their operand on: their line says where a value travels, not where it is made.
_PASSING = {"parameter", "copy", "get-tuple-element", "tuple", "custom-call", "bitcast"}
# Ops the walk visits at most: a bound, counted in ops (never in time), so the answer is the same
# on every run.
MAX_WALKED = 4000


def handed_origin(
    inst: Instruction, events: list[Event], repo_root: str, reference_lines: frozenset[tuple[str, int]]
) -> Instruction | None:
    """The first op (in program order) on the one distributed-only line that makes what the op
    `inst`, on a shared line, is handed; None when no such line, or several, make it."""
    root = Path(repo_root).resolve()
    by_name = {e.inst.name: e for e in events}
    start = by_name.get(inst.name)
    if start is None:
        return None
    made_by: dict[int, Event] = {}
    for e in events:
        for t in e.values:
            if isinstance(t, Term):
                made_by.setdefault(id(t), e)
    order = {e.inst.name: k for k, e in enumerate(events)}
    seen: set[str] = {inst.name}
    queue, made = [start], []
    while queue and len(seen) < MAX_WALKED:
        event = queue.pop()
        for operand in _operands(event, by_name, made_by):
            if operand.inst.name in seen:
                continue
            seen.add(operand.inst.name)
            own = _own_frame(operand.inst, root)
            if own is None or (own.file, own.line) in reference_lines or _passes_on(operand, by_name, made_by):
                queue.append(operand)
            else:
                made.append(operand)
    if queue:
        return None  # the walk stopped at its bound: what it found is not all the handed value comes from
    lines = {_at(op, root) for op in made}
    called_from = {(f.file, f.line) for op in made for f in op.inst.stack[1:] if in_repository(f, root)}
    inner = lines - called_from
    if len(inner) != 1:
        return None
    (line,) = inner
    return min((op for op in made if _at(op, root) == line), key=lambda op: order[op.inst.name]).inst


def _operands(event: Event, by_name: dict[str, Event], made_by: dict[int, Event]) -> list[Event]:
    """The events that made `event`'s operands; an operand bound by a call (a called body's
    parameter) is found by its terms, which are the call's operands'."""
    out: list[Event] = []
    for name in event.inst.operands:
        found = by_name.get(name.split("#")[0])
        if found is not None:
            out.append(found)
            continue
        value = event.values[0] if event.values else None
        if isinstance(value, Term):
            out += [made_by[id(a)] for a in value.args if id(a) in made_by]
    return out


def _passes_on(event: Event, by_name: dict[str, Event], made_by: dict[int, Event]) -> bool:
    if event.inst.opcode in _PASSING:
        return True
    mine = event.values[0] if event.values else None
    return isinstance(mine, Term) and any(o.values and o.values[0] is mine for o in _operands(event, by_name, made_by))


def _own_frame(inst: Instruction, root: Path) -> SourceLoc | None:
    return next((f for f in inst.stack if in_repository(f, root)), None)


def _at(event: Event, root: Path) -> tuple[str, int]:
    own = _own_frame(event.inst, root)
    assert own is not None  # only ops made on a repository line are collected
    return own.file, own.line
