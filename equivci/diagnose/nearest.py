"""The nearest source line of an op the compiler made.

XLA makes ops no user line wrote (a broadcast of a folded constant table, a copy the partitioner
inserts); their metadata has no source line, so a finding on one has no place a reviewer can
comment on. The line that comes closest is that of the op it is made from (its operand, when
that has a line) or else of its first user with one (the statement that consumes the value): the
finding carries that line and says whose it is.
"""

from __future__ import annotations

from equivci.diagnose.localize import source_of
from equivci.hlo.ir import Instruction
from equivci.translate.evaluator import Event

MAX_USERS = 64  # users followed forward past ops without a line: a bound counted in ops, not time


def nearest_located(inst: Instruction, events: list[Event], repo_root: str) -> tuple[Instruction, str] | None:
    """The op with a source line nearest `inst` and how it is related to it: an operand of it with
    a line ("it is made from"), else its first user with one in program order, past users without
    a line ("that first uses it"); None when neither is found."""
    by_name = {e.inst.name: e.inst for e in events}
    for name in inst.operands:
        operand = by_name.get(name.split("#")[0])
        if operand is not None and source_of(operand, repo_root)[0] is not None:
            return operand, "it is made from"
    reached, visited = {inst.name}, 0
    for event in events:
        if visited >= MAX_USERS:
            break
        if not reached.intersection(name.split("#")[0] for name in event.inst.operands):
            continue
        visited += 1
        if source_of(event.inst, repo_root)[0] is not None:
            return event.inst, "that first uses it"
        reached.add(event.inst.name)
    return None
