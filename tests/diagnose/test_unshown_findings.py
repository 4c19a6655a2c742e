"""Item 3 of issue 13: a finding for a model no check showed wrong says what could not be related
(the op, its shape, the reference op it should correspond to) and claims no defect."""

from __future__ import annotations

from equivci.capture.types import CapturedModel
from equivci.diagnose.findings import defect_findings
from equivci.diagnose.localize import Defect
from equivci.hlo.ir import Instruction, Shape, SourceLoc
from equivci.translate.evaluator import Event

CLAIM = "this slice takes the wrong window ([0:8) along dim 0 on device 0)"


def _inst(name: str, opcode: str, dims: tuple[int, ...], path: str, line: int) -> Instruction:
    return Instruction(name, opcode, Shape("f32", dims), (), {}, stack=(SourceLoc(path, line, "f"),))


def _case(tmp_path, dist_line: int):
    model = str(tmp_path / "model.py")
    captured = CapturedModel("m", (("tp", 2),), "", "", (), (), str(tmp_path))
    ref = [Event(_inst("x", "dot", (2, 8, 192), model, 30), [None]), Event(_inst("y", "slice", (2, 8, 64), model, 31),
                                                                            [None])]
    bad = _inst("d", "dot", (2, 8, 48), model, dist_line)
    return captured, [Event(bad, [None])], ref, Defect(bad, CLAIM, frontier=bad)


def test_unshown_finding_names_the_op_its_shape_and_the_reference_op_at_the_same_line(tmp_path):
    captured, events, ref, defect = _case(tmp_path, 30)
    [finding] = defect_findings(defect, captured, events, None, set(), outputs_equal=True, shown=False,
                                reference_events=ref)
    assert "cannot relate this `dot` (f32[2,8,48]" in finding.message
    assert "reference's `dot` (f32[2,8,192]) at model.py:30" in finding.message
    assert "wrong window" not in finding.message  # the oracle agreed: no defect is claimed


def test_unshown_finding_elsewhere_names_the_reference_op_it_could_be_a_shard_of(tmp_path):
    captured, events, ref, defect = _case(tmp_path, 50)
    [finding] = defect_findings(defect, captured, events, None, set(), outputs_equal=False, shown=False,
                                reference_events=ref)
    assert "f32[2,8,192] at model.py:30" in finding.message
    assert f"an unchecked guess at a cause: {CLAIM}" in finding.message  # labelled, not claimed


def test_near_miss_a_shown_difference_keeps_the_defect(tmp_path):
    captured, events, ref, defect = _case(tmp_path, 30)
    findings = defect_findings(defect, captured, events, None, set(), shown=True, reference_events=ref)
    assert findings[0].message.startswith(CLAIM)
