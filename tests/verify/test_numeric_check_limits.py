"""A numeric check that could not run is said so and is no verdict evidence: the model is
`unproven` with the reason, and the result is not stored (another run may have the time), while a
check that did not run by design (inputs too large) is a stored, deterministic answer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from equivci.capture.run import capture_model
from equivci.manifest import load_manifest
from equivci.options import Budgets
from equivci.results import Status
from equivci.verify import engine

MANIFEST = Path(__file__).resolve().parents[2] / "configs" / "buggy.yaml"
NAME = "mlp-tp-missing-psum"  # the proof fails: only the numeric check can say `mismatch`


@pytest.mark.slow
def test_a_numeric_check_past_its_time_limit_is_unproven_and_not_stored() -> None:
    manifest = load_manifest(MANIFEST)
    model = next(m for m in manifest.models if m.name == NAME)
    captured = capture_model(model, manifest)
    late = engine.verify_model(model, manifest, captured, budgets=Budgets(oracle_timeout_seconds=0.001))
    assert late.status == Status.UNPROVEN and late.limited
    assert any("could not run" in f.message and "did not finish within" in f.message for f in late.findings)
    skipped = engine.verify_model(model, manifest, captured, budgets=dataclasses.replace(Budgets(), oracle_elements=-1))
    assert skipped.status == Status.UNPROVEN and not skipped.limited
    assert any("did not run" in f.message for f in skipped.findings)
