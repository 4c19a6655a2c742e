"""Where a sum that comes out k times the reference value is divided, by the wrong constant.

A mean over the devices of an axis is written as a sum (a psum, or the reduction autodiff makes
for a value used on every device) followed by a division by the axis size. When the division is
there but its divisor is not the sum's factor (a count passed in wrong, 1 where the device count
belongs), the value after it is still a multiple of the reference value: the line a reviewer edits
is the division's (or the argument its divisor comes from), not the sum's, which is right as it
stands. Only a division counts: a product with a constant is as often the formula's own (an
optimizer's (1 - b) * g) as a mean's.
"""

from __future__ import annotations

from equivci.diagnose.frames import is_user_frame
from equivci.terms.ir import Term
from equivci.translate.arrays import all_equal
from equivci.translate.evaluator import Event

MAX_USES = 16  # uses of the sum looked at: a bound in ops, the same every run


def constant_division(reduction: Event, events: list[Event], constants: dict) -> tuple[Event, float] | None:
    """The first op in program order, in the user's code, that divides the reduction's value by a
    constant a whole number >= 1, with that number; None when no such use follows among its first
    uses."""
    by_name = {e.inst.name: e for e in events}
    start = next((k for k, e in enumerate(events) if e is reduction), len(events))
    uses = [e for e in events[start + 1 :] if reduction.inst.name in e.inst.operands][:MAX_USES]
    for event in uses:
        inst = event.inst
        if inst.opcode != "divide" or len(inst.operands) != 2 or inst.operands[0] != reduction.inst.name:
            continue
        divisor = by_name.get(inst.operands[1])
        value = _constant(divisor, constants) if divisor is not None else None
        if value is not None and value >= 1 and float(value).is_integer() and any(is_user_frame(f) for f in inst.stack):
            return event, value
    return None


def _constant(event: Event, constants: dict) -> float | None:
    """The one value every element of the op's value holds on every device, if it is a constant."""
    held = [constants.get(t) if isinstance(t, Term) else None for t in event.values]
    found = [v for v in held if v is not None and all_equal(v)]
    if not held or len(found) != len(held):
        return None
    values = {float(v.flat[0]) for v in found}
    return values.pop() if len(values) == 1 else None
