"""SARIF 2.1.0 (as GitHub code scanning accepts it) and markdown renderings of a constructed report."""

from __future__ import annotations

import json

from equivci.report import markdown, sarif
from equivci.results import Finding, LayerCounts, ModelResult, Report, Status

REPORT = Report(
    models=(
        ModelResult("mlp-tp", Status.VERIFIED, 1.25, LayerCounts(32, 32, 30)),
        ModelResult(
            "mlp-tp-buggy",
            Status.MISMATCH,
            3.5,
            findings=(
                Finding("models/mlp_tp_buggy.py", 28, "error", None, "psum missing", op="dot_general.5"),
                Finding("models/mlp_tp_buggy.py", 28, "error", None, "counterexample: 1 vs 2"),
            ),
        ),
        ModelResult("attn", Status.UNPROVEN, 2.0, findings=(Finding("models/attn.py", 57, "warning", "layers_3", "k | q <x>"),)),
        ModelResult("broken", Status.ERROR, 0.1, findings=(Finding(None, None, "error", None, "cannot import models/x.py"),)),
    )
)


def test_sarif_is_code_scanning_shaped(tmp_path):
    doc = json.loads(sarif.render(REPORT, tmp_path, "equivci.yaml"))
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    (run,) = doc["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "equivci" and driver["version"]
    rules = driver["rules"]
    ids = [r["id"] for r in rules]
    assert ids == ["EQV001", "EQV002", "EQV003", "EQV004"]  # stable, documented ids
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["help"]["text"] and rule["fullDescription"]["text"]
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tmp_path.resolve().as_uri() + "/"
    results = run["results"]
    assert len(results) == 4
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        (loc,) = r["locations"]
        art = loc["physicalLocation"]["artifactLocation"]
        assert art["uriBaseId"] == "%SRCROOT%" and not art["uri"].startswith("/")
        assert loc["physicalLocation"]["region"]["startLine"] >= 1
        assert r["message"]["text"] and r["partialFingerprints"]
    first = results[0]
    assert first["ruleId"] == "EQV001" and first["level"] == "error"
    assert first["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "models/mlp_tp_buggy.py"
    assert first["locations"][0]["physicalLocation"]["region"]["startLine"] == 28
    assert first["properties"]["op"] == "dot_general.5"
    assert results[2]["ruleId"] == "EQV002" and results[2]["level"] == "warning"
    # no path: placed on the manifest
    assert results[3]["ruleId"] == "EQV003"
    assert results[3]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "equivci.yaml"
    # fingerprints: stable across renders, distinct per finding
    again = json.loads(sarif.render(REPORT, tmp_path, "equivci.yaml"))["runs"][0]["results"]
    assert [r["partialFingerprints"] for r in again] == [r["partialFingerprints"] for r in results]
    assert len({json.dumps(r["partialFingerprints"]) for r in results}) == 4


def test_sarif_of_a_clean_report_has_rules_and_no_results():
    doc = json.loads(sarif.render(Report(models=(REPORT.models[0],))))
    assert doc["runs"][0]["results"] == [] and len(doc["runs"][0]["tool"]["driver"]["rules"]) == 4
    assert "originalUriBaseIds" not in doc["runs"][0]


def test_markdown_report():
    text = markdown.render(REPORT, None, link_base="https://github.com/o/r/blob/abc")
    lines = text.splitlines()
    assert lines[0] == "### 🛑 equivci: 4 models: 1 verified, 1 mismatch, 1 unproven, 1 error"
    assert "| mlp-tp | ✅ verified | 32/32 | 30 | 1.2 s |" in lines
    assert "| mlp-tp-buggy | ❌ mismatch | – | – | 3.5 s |" in lines
    assert "#### ❌ mlp-tp-buggy: mismatch" in lines
    assert "- [`models/mlp_tp_buggy.py:28`](https://github.com/o/r/blob/abc/models/mlp_tp_buggy.py#L28): psum missing (op `dot_general.5`)" in lines
    assert "- [`models/attn.py:57`](https://github.com/o/r/blob/abc/models/attn.py#L57): k \\| q &lt;x&gt; (layer `layers_3`)" in lines
    assert "- cannot import models/x.py" in lines


def test_markdown_without_links_and_empty():
    text = markdown.render(Report(models=(REPORT.models[1],)))
    assert "- `models/mlp_tp_buggy.py:28`: counterexample: 1 vs 2" in text
    assert "#### Findings" in text
    assert "No model was selected" in markdown.render(Report(models=()))


def test_a_proof_under_an_input_assumption_says_so_in_the_status_table():
    """A `verified` that rests on an assumption about the inputs (its `note`) must not read, in the
    table a reviewer sees first, like one that holds for every input."""
    assumed = ModelResult(
        "rope-offset",
        Status.VERIFIED,
        1.0,
        findings=(Finding("models/rope.py", 22, "note", None, "proved for input [4] in [0, 16]"),),
    )
    lines = markdown.status_table(Report(models=(assumed, REPORT.models[0])))
    assert "| rope-offset | ✅ verified, assuming the inputs its note names | – | – | 1.0 s |" in lines
    assert "| mlp-tp | ✅ verified | 32/32 | 30 | 1.2 s |" in lines  # no note: no qualifier
