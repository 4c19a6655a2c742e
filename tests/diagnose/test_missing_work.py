"""Findings on the localization cases (configs/localize.yaml): missing work is blamed where the
reference writes it, in the reference's terms, and one cause repeated in every layer is one finding.

Real CLI runs (capture on fake CPU devices, the proof, the numeric oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = yaml.safe_load((ROOT / "examples/localize/expected.yaml").read_text())
MODELS = [
    "stack-tp",
    "stack-tp-no-final-norm",
    "stack-tp-no-residual",
    "mlp-tp-unfinished-return",
    "scores-heads-unscaled",
]
FINAL_NORM = 'return rms_norm(x, params["final_norm"]) @ params["lm_head"]'
RESIDUAL = 'return x + jax.nn.silu(h @ p["w1"]) @ p["w2"]'
SOURCE = (ROOT / "examples/localize/stack.py").read_text().splitlines()


def line_of(text: str) -> int:
    """The first line of examples/localize/stack.py that is `text`, stripped."""
    return next(k + 1 for k, line in enumerate(SOURCE) if line.strip() == text)


@pytest.fixture(scope="module")
def results(verify_once) -> dict[str, dict]:
    run = verify_once("configs/localize.yaml", MODELS, cwd=ROOT, args=["--no-cache"], timeout=900, fresh_cache=False)
    assert run.code in (0, 1) and set(run.models) == set(MODELS), run.stderr[-3000:]
    return run.models


def first(result: dict) -> dict:
    return result["findings"][0]


def test_the_correct_stack_verifies(results):
    assert results["stack-tp"]["status"] == "verified", results["stack-tp"]["findings"]


def test_missing_final_norm_blames_the_lm_head_line_and_cites_the_reference(results):
    f = first(results["stack-tp-no-final-norm"])
    assert f"{f['path']}:{f['line']}" == EXPECTED["stack-tp-no-final-norm"]["bug_line"]
    assert "rms_norm" in f["message"] and f"stack.py:{line_of(FINAL_NORM)}" in f["message"], f["message"]
    assert f["layer"] is None  # the LM head is outside every layer
    # the numeric frontier agrees with the proof
    assert "where the values first differ" in f["message"]


def test_missing_residual_is_one_finding_for_every_layer(results):
    result = results["stack-tp-no-residual"]
    f = first(result)
    assert f"{f['path']}:{f['line']}" == EXPECTED["stack-tp-no-residual"]["bug_line"], result["findings"]
    assert "`add`" in f["message"] and f"stack.py:{line_of(RESIDUAL)}" in f["message"], f["message"]
    assert f["layer"] == "layers_0" and "3 more layers" in f["message"], f["message"]
    # one cause: the other findings (the counterexample) sit on the same line
    assert {(g["path"], g["line"]) for g in result["findings"] if g["severity"] == "error"} == {(f["path"], f["line"])}


def test_an_output_returned_before_the_reference_s_last_step_blames_the_return(results):
    """Every value is related and only the output is not: the reference's residual add after the
    value the shard body returns is missing, blamed on the `return` (not a finding without a place)."""
    f = first(results["mlp-tp-unfinished-return"])
    assert f"{f['path']}:{f['line']}" == EXPECTED["mlp-tp-unfinished-return"]["bug_line"], f
    assert "`out` is returned" in f["message"] and "`add`" in f["message"], f["message"]
    assert "steps.py:20 (`return x + h @ w_out`)" in f["message"], f["message"]


def test_a_step_missing_before_a_where_is_found_through_its_call(results):
    """The reference's `jnp.where` is a called computation whose select takes the callee's
    parameters; the missing scale before it is still found, and blamed after the statement that
    made the value (the scale is its own statement, next to it), with the where as a tied note."""
    findings = results["scores-heads-unscaled"]["findings"]
    f = findings[0]
    assert f"{f['path']}:{f['line']}" == EXPECTED["scores-heads-unscaled"]["bug_line"], findings
    assert "`multiply`" in f["message"] and "s = s * HD**-0.5" in f["message"], f["message"]
    assert "mask" not in f["message"], f["message"]
    assert any(g["severity"] == "note" and g["tie"] == f["tie"] and g["line"] == 48 for g in findings), findings
