"""The diff as a tie-breaker: of equally supported places, a changed line leads; nothing else moves."""

from equivci.diagnose.ranking import changed_first
from equivci.results import Finding


def finding(line: int, severity: str, tie: int | None, changed: bool = False) -> Finding:
    return Finding("m.py", line, severity, None, f"at {line}", tie=tie, changed=changed)


def test_a_changed_alternative_takes_the_lead_and_the_error():
    ranked = changed_first((finding(10, "error", 0), finding(20, "note", 0, changed=True), finding(30, "error", None)))
    assert [(f.line, f.severity) for f in ranked] == [(20, "error"), (10, "note"), (30, "error")]


def test_without_a_changed_line_the_order_stays():
    findings = (finding(10, "error", 0), finding(20, "note", 0), finding(30, "error", None, changed=True))
    assert changed_first(findings) == findings


def test_untied_findings_never_move():
    findings = (finding(10, "error", None), finding(20, "error", None, changed=True))
    assert changed_first(findings) == findings
