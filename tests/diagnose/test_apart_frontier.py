"""A value numerics shows differs, not computed from the op where the proof stops, leads: the stop
(an index numerics does not compare, such as a vocabulary shard's offset test) cannot account for
it. A frontier computed from the stop leaves the proof's finding first."""

from __future__ import annotations

from equivci.capture.types import CapturedModel
from equivci.diagnose.findings import defect_findings
from equivci.diagnose.localize import Defect
from equivci.diagnose.numeric import NumericFrontier
from equivci.hlo.ir import Instruction, Shape, SourceLoc
from equivci.translate.evaluator import Event

SOURCE = """\
def picked_and_entropy(logits, raw, ids):
    picked = take(logits, ids)
    ent = lse - (p * raw).sum(-1)
    return picked, ent
"""


def _case(tmp_path, apart: bool, line: int = 3):
    model = tmp_path / "model.py"
    model.write_text(SOURCE)

    def inst(name: str, opcode: str, dtype: str, line: int, operands: tuple[str, ...] = ()) -> Instruction:
        return Instruction(name, opcode, Shape(dtype, (4, 8)), operands, {}, stack=(SourceLoc(str(model), line, "f"),))

    stop = inst("ge.1", "compare", "pred", 2)
    product = inst("mul.1", "multiply", "f32", line)
    captured = CapturedModel("m", (("tp", 2),), "", "", (), (), str(tmp_path))
    events = [Event(stop, [None]), Event(product, [None])]
    defect = Defect(stop, "`operand 2` in the `compare` there is 4 on device 1, where the reference's uses 0")
    frontier = NumericFrontier(events[1], device=0, compared=2, apart=apart)
    return defect_findings(defect, captured, events, None, set(), frontier)


def test_a_difference_apart_from_the_stop_leads(tmp_path):
    findings = _case(tmp_path, apart=True)
    assert [(f.line, f.severity) for f in findings[:2]] == [(3, "error"), (2, "note")], findings
    assert "not computed from the op where the proof stops" in findings[0].message
    assert "where the proof stops" in findings[1].message


def test_near_miss_a_difference_computed_from_the_stop_keeps_the_proofs_finding_first(tmp_path):
    findings = _case(tmp_path, apart=False)
    assert (findings[0].line, findings[0].severity) == (2, "error"), findings
    assert "first differ from the reference's at the `multiply`" in findings[0].message


def test_near_miss_a_difference_on_the_stops_own_line_agrees_with_it(tmp_path):
    findings = _case(tmp_path, apart=True, line=2)
    assert (findings[0].line, findings[0].severity) == (2, "error"), findings
    assert "this is where the values first differ" in findings[0].message
