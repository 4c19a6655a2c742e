"""Pure publishing logic on constructed reports: comment body, in/out-of-diff split, annotations, outputs."""

from __future__ import annotations

from equivci.ci import publish
from equivci.git import DiffLines, FileDiff
from equivci.results import Finding, LayerCounts, ModelResult, Report, Status


def F(path, line, message, severity="error", layer=None):
    return Finding(path=path, line=line, severity=severity, layer=layer, message=message)


REPORT = Report(
    models=(
        ModelResult("good", Status.VERIFIED, 1.2, LayerCounts(2, 2, 1)),
        ModelResult("loose", Status.UNPROVEN, 2.0, findings=(F("m/u.py", 5, "op not related", "warning", "layers_1"),)),
        ModelResult(
            "bad",
            Status.MISMATCH,
            3.0,
            findings=(
                F("m/tp.py", 28, "partial sum returned: psum missing"),
                F("m/tp.py", 28, "counterexample: 1.0 vs 2.0"),
                F("m/other.py", 3, "outside | the diff"),
            ),
        ),
        ModelResult("broken", Status.ERROR, 0.1, findings=(F(None, None, "import failed:\nValueError, nope"),)),
    )
)

DIFF = DiffLines({"m/tp.py": FileDiff(frozenset(range(25, 32)), frozenset({28})), "m/u.py": FileDiff(frozenset({4, 5}), frozenset({5}))})


def test_findings_worst_first():
    ordered = [(m.name, f.message[:10]) for m, f in publish.ordered_findings(REPORT)]
    assert ordered[0] == ("broken", "import fai")
    assert [n for n, _ in ordered[1:4]] == ["bad"] * 3
    assert ordered[-1] == ("loose", "op not rel")


def test_split_review_groups_one_line_and_keeps_out_of_diff_for_summary():
    comments, outside = publish.split_review(REPORT, DIFF)
    assert [(c.path, c.line) for c in comments] == [("m/tp.py", 28), ("m/u.py", 5)]
    tp = comments[0]
    assert "psum missing" in tp.body and "counterexample" in tp.body
    assert tp.payload() == {"path": "m/tp.py", "line": 28, "side": "RIGHT", "body": tp.body}
    assert publish.FINDING_MARKER.format(key=tp.key, model="bad") in tp.body
    assert {f.message for _, f in outside} == {"import failed:\nValueError, nope", "outside | the diff"}


def test_rerun_skips_comments_already_posted():
    comments, _ = publish.split_review(REPORT, DIFF)
    assert publish.new_review_comments(comments, [comments[0].body]) == [comments[1]]
    # a different message on the same line is new
    changed = Report(models=(ModelResult("bad", Status.MISMATCH, 1, findings=(F("m/tp.py", 28, "other"),)),))
    again, _ = publish.split_review(changed, DIFF)
    assert publish.new_review_comments(again, [comments[0].body]) == again


def test_summary_comment_has_marker_table_outside_findings_and_notes():
    comments, outside = publish.split_review(REPORT, DIFF)
    body = publish.summary_comment(
        REPORT, outside, in_review=sum(c.findings for c in comments), notes=["read-only"], link_base="https://gh/o/r/blob/abc", run_url="https://gh/run/1"
    )
    assert body.startswith(publish.MARKER + "\n")
    assert "| bad | ❌ mismatch |" in body
    assert "| good | ✅ verified | 2/2 | 1 |" in body
    assert "Findings outside this pull request's diff" in body
    assert "[`m/other.py:3`](https://gh/o/r/blob/abc/m/other.py#L3)" in body
    assert "outside \\| the diff" in body
    assert "import failed:<br>ValueError, nope" in body
    assert "psum missing" not in body  # that one is a line comment
    assert "3 findings are shown as review comments" in body
    assert [c.findings for c in comments] == [2, 1]
    assert "> read-only" in body and "(https://gh/run/1)" in body


def test_summary_without_findings():
    body = publish.summary_comment(Report(models=(ModelResult("good", Status.VERIFIED, 1.0),)))
    assert "✅ equivci: 1 model: 1 verified" in body and "Findings" not in body
    assert "nothing to verify" in publish.summary_comment(Report(models=()))


def test_annotations_escape_and_order():
    lines, dropped = publish.annotations(REPORT)
    assert dropped == 0
    assert lines[0] == "::error title=equivci%3A broken is error::import failed:%0AValueError, nope"
    assert lines[1] == "::error file=m/tp.py,line=28,title=equivci%3A bad is mismatch::partial sum returned: psum missing"
    assert lines[-1] == "::warning file=m/u.py,line=5,title=equivci%3A loose is unproven (layers_1)::op not related"


def test_annotations_respect_per_step_limits():
    many = tuple(F("a.py", i, f"e{i}") for i in range(1, 15)) + tuple(F("a.py", i, f"w{i}", "warning") for i in range(1, 13))
    report = Report(models=(ModelResult("m", Status.MISMATCH, 1.0, findings=many),))
    lines, dropped = publish.annotations(report)
    assert sum(line.startswith("::error ") for line in lines) == 10
    assert sum(line.startswith("::warning ") for line in lines) == 10
    assert dropped == 6
    assert "line=1," in lines[0] and "::e1" in lines[0]  # worst first, then program order


def test_model_without_findings_still_annotated():
    lines, _ = publish.annotations(Report(models=(ModelResult("quiet", Status.UNPROVEN, 1.0),)))
    assert lines == ["::error title=equivci%3A quiet is unproven::quiet is unproven"]


def test_outputs():
    out = publish.outputs(REPORT, sarif="/tmp/r/equivci.sarif", report_dir="/tmp/r")
    assert out["status"] == "error"
    assert (out["verified"], out["mismatch"], out["unproven"], out["error"]) == ("1", "1", "1", "1")
    assert out["models"] == "4" and out["findings"] == "5"
    assert out["sarif"] == "/tmp/r/equivci.sarif" and out["report-dir"] == "/tmp/r"
    text = publish.format_outputs({"a": "1", "b": "x\ny"})
    assert text.startswith("a=1\nb<<EQUIVCI_") and "\nx\ny\nEQUIVCI_" in text
    assert publish.outputs(Report(models=()))["status"] == "none"
