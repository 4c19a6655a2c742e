"""An op XLA made has no source line (a broadcast of a folded constant table, a copy the
partitioner inserts): a finding on it carries the line of the op it is made from when that has
one, else of its first user with one, and says so. Near miss: an op with its own line keeps it."""

from __future__ import annotations

from equivci.capture.types import CapturedModel
from equivci.diagnose.findings import defect_findings
from equivci.diagnose.localize import Defect
from equivci.diagnose.nearest import nearest_located
from equivci.hlo.ir import Instruction, Shape, SourceLoc
from equivci.translate.evaluator import Event

SOURCE = """\
def scaled(x):
    table = arange(16) * 0.1
    y = x * table
    return transpose(y)
"""


def _events(tmp_path) -> tuple[list[Event], str]:
    model = tmp_path / "model.py"
    model.write_text(SOURCE)

    def inst(name: str, opcode: str, line: int | None, operands: tuple[str, ...] = ()) -> Instruction:
        stack = (SourceLoc(str(model), line, "scaled"),) if line is not None else ()
        return Instruction(name, opcode, Shape("f32", (4, 16)), operands, {}, stack=stack)

    ops = [
        inst("constant.1", "constant", None),
        inst("broadcast.2", "broadcast", None, ("constant.1",)),  # made by XLA from a folded table
        inst("copy.3", "copy", None, ("broadcast.2",)),  # nor has its first user a line
        inst("multiply.4", "multiply", 3, ("param.0", "copy.3")),
        inst("transpose.5", "transpose", 4, ("multiply.4",)),
        inst("copy.6", "copy", None, ("multiply.4",)),  # an XLA copy of a value a line made
    ]
    return [Event(op, [None]) for op in ops], str(tmp_path)


def test_the_first_user_with_a_line_past_users_without_one(tmp_path):
    events, root = _events(tmp_path)
    near = nearest_located(events[1].inst, events, root)
    assert near is not None and (near[0].name, near[1]) == ("multiply.4", "that first uses it"), near


def test_the_op_it_is_made_from_when_that_has_a_line(tmp_path):
    events, root = _events(tmp_path)
    near = nearest_located(events[5].inst, events, root)
    assert near is not None and (near[0].name, near[1]) == ("multiply.4", "it is made from"), near


def test_a_finding_on_an_op_without_a_line_carries_the_nearest_and_says_so(tmp_path):
    events, root = _events(tmp_path)
    captured = CapturedModel("m", (("tp", 2),), "", "", (), (), root)
    findings = defect_findings(Defect(events[1].inst, "`broadcast` here differs"), captured, events, None, set())
    assert (findings[0].path, findings[0].line) == ("model.py", 3), findings
    assert "XLA made this `broadcast` (no source line, HLO `broadcast.2`)" in findings[0].message
    assert "the `multiply` that first uses it" in findings[0].message


def test_near_miss_an_op_with_its_own_line_keeps_it(tmp_path):
    events, root = _events(tmp_path)
    captured = CapturedModel("m", (("tp", 2),), "", "", (), (), root)
    findings = defect_findings(Defect(events[4].inst, "`transpose` here differs"), captured, events, None, set())
    assert (findings[0].path, findings[0].line) == ("model.py", 4), findings
    assert "XLA made" not in findings[0].message
