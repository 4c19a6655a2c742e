"""Both programs as terms, every distributed loop that matches a reference loop proved once, by induction."""

from __future__ import annotations

import functools

from equivci.capture.types import LeafPlacement
from equivci.hlo.ir import Module
from equivci.options import Budgets
from equivci.prove.loops import LoopMatcher
from equivci.prove.saturate import MAX_ITERATIONS
from equivci.translate.programs import Programs, translate


def build_programs(
    reference: Module,
    distributed: Module,
    inputs: tuple[LeafPlacement, ...],
    outputs: tuple[LeafPlacement, ...],
    num_devices: int,
    iterations: int = MAX_ITERATIONS,
    budgets: Budgets = Budgets(),
    int_range: tuple[int, int] | None = None,
) -> Programs:
    """`iterations`: the saturation budget of the loop step proofs; `int_range`: [lo, hi) of every
    integer input, as the manifest states it."""
    return translate(
        reference,
        distributed,
        inputs,
        outputs,
        num_devices,
        loops=functools.partial(LoopMatcher, iterations=iterations),
        budgets=budgets,
        int_range=int_range,
    )
