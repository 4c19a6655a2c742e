"""Both programs as terms, every distributed loop that matches a reference loop proved once, by induction."""

from __future__ import annotations

from equivci.capture.types import LeafPlacement
from equivci.hlo.ir import Module
from equivci.prove.loops import LoopMatcher
from equivci.translate.programs import Programs, translate


def build_programs(reference: Module, distributed: Module, inputs: tuple[LeafPlacement, ...],
                   outputs: tuple[LeafPlacement, ...], num_devices: int) -> Programs:
    return translate(reference, distributed, inputs, outputs, num_devices, loops=LoopMatcher)
