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


def _constant_guess(tmp_path, constants: tuple[float, float]) -> str:
    captured, events, ref, defect = _case(tmp_path, 50)
    claim = f"`operand 1` in the `divide` there is {constants[0]:g} on device 0, where the reference uses {constants[1]:g}"
    defect = Defect(defect.inst, claim, frontier=defect.inst, constants=constants)
    [finding] = defect_findings(defect, captured, events, None, set(), outputs_equal=False, shown=False,
                                reference_events=ref)
    return finding.message


def test_a_mean_over_a_part_of_the_rows_is_no_guessed_cause(tmp_path):
    """1/16 where the reference divides by 64 (a microbatch's mean on one of two shards): a later
    sum over the parts brings the reference's mean back, so no constant is guessed at (a correct
    model's unproven finding must not read as a bug); 1/3 against 1/9 in float32 too."""
    for constants in ((0.0625, 0.015625), (float(1 / 3), float(1 / 9)), (-0.125, -0.03125)):
        message = _constant_guess(tmp_path, constants)
        assert "unchecked guess" not in message and "No check shows a difference" in message


def test_near_miss_a_constant_no_part_mean_explains_stays_a_guess(tmp_path):
    """More than the reference divides by, or no reciprocal of a whole count: still a guess."""
    for constants in ((0.015625, 0.0625), (0.75, 0.25), (256.0, 128.0), (-0.125, 0.03125)):
        assert "an unchecked guess at a cause: `operand 1`" in _constant_guess(tmp_path, constants)
