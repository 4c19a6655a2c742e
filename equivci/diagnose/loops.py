"""Localization through loops: the first defect in program order, inside the body of a loop whose
step was not proved (equivci.prove.loops) when it comes before any defect outside."""

from __future__ import annotations

import dataclasses

from equivci.diagnose.localize import Defect, first_defect, unfinished_output
from equivci.hlo.collectives import axis_groups
from equivci.prove.loops import LoopAttempt
from equivci.prove.saturate import Proof
from equivci.translate.programs import Programs


def defect_with_loops(programs: Programs, proof: Proof, mesh: tuple[tuple[str, int], ...]) -> Defect | None:
    """The first defect in program order, looking inside a loop whose step was not proved."""
    outputs = {id(t) for dev in programs.device_outputs for t in dev}
    # A loop's initial state is an output too: its proof needs it related (a partial sum is not).
    outputs |= {id(pair[0]) for pair, ok in zip(programs.obligations, proof.obligations) if not ok}
    found = first_defect(
        programs.distributed_events,
        proof,
        programs.evaluator,
        axis_groups(mesh),
        outputs,
        routed=programs.routed,
        reference_events=programs.reference_events,
    )
    failed = next((a for a in programs.loops if a.failed_step), None)
    if failed is not None and (found is None or _position(programs, found) > failed.position):
        return _inside(failed, mesh)
    if found is None:
        return _unproved_initial_state(programs, proof) or unfinished_output(
            programs.distributed_events,
            programs.reference_events,
            proof,
            programs.evaluator,
            axis_groups(mesh),
            programs.reference_outputs,
            programs.device_outputs,
        )
    return found


def _inside(attempt: LoopAttempt, mesh: tuple[tuple[str, int], ...]) -> Defect:
    if attempt.proof is None or attempt.step is None:  # set together, by LoopMatcher
        return Defect(attempt.inst, f"this loop is not verified: {attempt.reason}")
    found = defect_with_loops(attempt.step, attempt.proof, mesh)
    if found is None:
        return Defect(
            attempt.inst,
            "this loop's body could not be shown to keep every state element the same slice "
            "of the reference loop's state from one iteration to the next (the loop invariant)",
        )
    if found.inst.name in {e.inst.name for e in attempt.step.distributed_events}:
        found = dataclasses.replace(
            found, message=found.message + " (in a loop body, checked once for every iteration of the loop)"
        )
    return found


def _position(programs: Programs, defect: Defect) -> int:
    return next(
        (k for k, e in enumerate(programs.distributed_events) if e.inst is defect.inst),
        len(programs.distributed_events),
    )


def _unproved_initial_state(programs: Programs, proof: Proof) -> Defect | None:
    unproved = {id(pair[0]) for pair, ok in zip(programs.obligations, proof.obligations) if not ok}
    for attempt in programs.loops:
        if any(id(value) in unproved for dev in attempt.init for value in dev):
            return Defect(
                attempt.inst,
                "this loop's initial state is not the slice of the reference loop's initial "
                "state that its body was verified for",
            )
    return None
