"""Where the program takes over a gradient that autodiff made.

JAX's transpose is exact for the function it differentiates: when the first value that stays
apart from the reference is one autodiff made (its name stack says `transpose(...)`), and the values
before it are related, the gradient is what the grad call of that function must give on this
device's data (a share of the reference's gradient, say). What is wrong is what the program then
does with it: the reduction over the devices it leaves out, a scale, the helper it hands the
gradient to. JAX attributes autodiff's ops to the forward lines, which are right; the place to
look is the gradient's first use outside autodiff.
"""

from __future__ import annotations

from equivci.diagnose.frames import is_user_frame
from equivci.hlo.ir import TRIVIAL_OPS, Instruction
from equivci.translate.evaluator import Event

MAX_FOLLOWED = 4000  # ops followed through uses: a bound in ops, so the answer is the same every run


def made_by_autodiff(inst: Instruction) -> bool:
    return "transpose(" in inst.op_name


def first_use_after_autodiff(event: Event, events: list[Event]) -> Event | None:
    """The first op in program order, in the user's code and outside autodiff, that the autodiff
    op of `event` reaches through uses; None when none does within the bound."""
    reached, followed = {event.inst.name}, 0
    start = next((k for k, e in enumerate(events) if e is event), len(events))
    for later in events[start + 1 :]:
        inst = later.inst
        if not reached.intersection(inst.operands):
            continue
        followed += 1
        if followed > MAX_FOLLOWED:
            return None
        outside = inst.opcode not in TRIVIAL_OPS and not made_by_autodiff(inst) and "jvp(" not in inst.op_name
        if outside and any(is_user_frame(f) for f in inst.stack):
            return later
        reached.add(inst.name)
    return None
