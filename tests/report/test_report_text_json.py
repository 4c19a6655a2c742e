"""Text and JSON rendering of constructed reports, and the plain progress lines."""

from __future__ import annotations

import io
import json

from equivci import __version__
from equivci.report.json_report import report_to_dict, write_json
from equivci.report.text import RunProgress, write_text
from equivci.results import Finding, LayerCounts, ModelResult, Report, Status

FINDING = Finding(
    path="models/llama_tp.py", line=57, severity="error", layer="layers_3",
    message="k = slice(qkv, ...) is not a shard of the reference k [0]['w']",
)
REPORT = Report(
    models=(
        ModelResult("llama-tp", Status.UNPROVEN, 1.94, LayerCounts(32, 31, 30), (FINDING,)),
        ModelResult("mlp", Status.VERIFIED, 0.5),
        ModelResult("broken", Status.ERROR, 0.25, findings=(
            Finding(path="equivci.yaml", line=None, severity="error", layer=None, message="capture died:\nlast line"),
        )),
    )
)


def test_json_has_exactly_the_contract_keys() -> None:
    out = io.StringIO()
    write_json(REPORT, out)
    doc = json.loads(out.getvalue())  # exactly one document
    assert doc["equivci"] == __version__
    first = doc["models"][0]
    assert {"name", "status", "seconds", "layers", "findings"} <= set(first)
    assert first["name"] == "llama-tp" and first["status"] == "unproven" and first["seconds"] == 1.94
    assert first["layers"] == {"total": 32, "verified": 31, "reused": 30}
    finding = first["findings"][0]
    assert {"path", "line", "severity", "layer", "message"} <= set(finding)
    assert (finding["path"], finding["line"], finding["severity"], finding["layer"]) == ("models/llama_tp.py", 57, "error", "layers_3")
    assert doc["models"][1]["findings"] == [] and doc["models"][1]["layers"] == {"total": 0, "verified": 0, "reused": 0}
    assert "error" not in doc


def test_json_error_document() -> None:
    doc = report_to_dict(Report(models=()), error="equivci.yaml: version: missing")
    assert doc["models"] == [] and doc["error"] == "equivci.yaml: version: missing"


def test_text_report_plain() -> None:
    out = io.StringIO()
    write_text(REPORT, out)
    text = out.getvalue()
    assert "\x1b[" not in text  # no colors when not a terminal
    lines = text.splitlines()
    assert lines[0].startswith("llama-tp  unproven  1.9 s  layers 31/32 verified, 30 reused")
    # Rich markup characters in messages are printed as they are, and long lines are not wrapped.
    assert "  models/llama_tp.py:57: k = slice(qkv, ...) is not a shard of the reference k [0]['w']  [layers_3]" in lines
    assert lines[2] == "mlp  verified  0.5 s"
    assert "  equivci.yaml: capture died:" in lines and "    last line" in lines
    assert lines[-1] == "equivci: 3 models: 1 verified, 1 unproven, 1 error (2.7 s)"


def test_text_summary_with_no_models() -> None:
    out = io.StringIO()
    write_text(Report(models=()), out)
    assert out.getvalue() == "equivci: 0 models: nothing selected (0.0 s)\n"


def test_progress_plain_lines() -> None:
    out = io.StringIO()
    with RunProgress(2, out) as progress:
        progress.started("llama-tp")
        progress.finished(ModelResult("llama-tp", Status.VERIFIED, 1.23))
        progress.started("mlp")
        progress.finished(ModelResult("mlp", Status.MISMATCH, 0.4))
    assert out.getvalue().splitlines() == [
        "equivci: [1/2] llama-tp: verified (1.2 s)",
        "equivci: [2/2] mlp: mismatch (0.4 s)",
    ]


def test_progress_plain_layer_lines_are_rate_limited() -> None:
    out = io.StringIO()
    with RunProgress(1, out) as progress:
        progress.started("llama-405b")
        for done in range(1, 128):
            progress.layer("llama-405b", done, 127)  # fast layers: only the last one is worth a line
    assert out.getvalue().splitlines() == ["equivci:   llama-405b: layers 127/127"]


def test_progress_plain_under_ci_even_on_a_terminal(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    with RunProgress(1, out) as progress:
        progress.finished(ModelResult("a", Status.VERIFIED, 0.0))
    assert out.getvalue() == "equivci: [1/1] a: verified (0.0 s)\n"
