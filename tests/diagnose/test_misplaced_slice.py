"""The claim that a slice takes windows out of device order is made only of the op that cut them
so: windows cut in device order and then moved round a ring (a collective-permute, as ring
attention passes its key blocks) were not misplaced by the cut."""

from __future__ import annotations

from equivci.diagnose.localize import misplaced_slice
from equivci.hlo.ir import Instruction
from equivci.terms.ir import Term
from equivci.translate.evaluator import Event

X = Term("param", (1,), (), (2, 16), "f32")
BLOCKS = [Term("slice", (1, 4 * d, 4 * d + 4), (X,), (2, 4), "f32") for d in range(4)]
ROTATED = BLOCKS[1:] + BLOCKS[:1]  # device d holds block d + 1


def _event(name: str, terms: list[Term]) -> Event:
    return Event(Instruction(name, "slice", None, (), {}), list(terms))  # type: ignore[arg-type]


def test_windows_cut_in_device_order_then_moved_round_a_ring_are_not_misplaced():
    assert misplaced_slice([_event("slice.1", BLOCKS)], [ROTATED]) is None


def test_near_miss_windows_cut_out_of_device_order_are_misplaced():
    found = misplaced_slice([_event("slice.1", ROTATED)], [ROTATED])
    assert found is not None
    event, message = found
    assert event.inst.name == "slice.1" and "[4:8), [8:12), [12:16), [0:4)" in message, message
