"""Findings at the line that chooses a device's part (examples/localize/offsets.py): a slice start
bound to the device's index alone, and row positions offset by it without the block stride, lead
where the part is chosen, not where it is used. Real CLI runs (capture on fake CPU devices, the
proof, the numeric oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from equivci.testing.runs import verify_json

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = yaml.safe_load((ROOT / "examples/localize/expected.yaml").read_text())
MODELS = ["expert-gates-first-expert", "band-rows-no-stride"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    run = verify_json("configs/localize.yaml", MODELS, cwd=ROOT, args=["--no-cache"], timeout=900)
    assert run.code in (0, 1) and set(run.models) == set(MODELS), run.stderr[-3000:]
    return run.models


def _first(result: dict) -> dict:
    return result["findings"][0]


def test_a_slice_start_bound_to_the_device_index_alone_leads_at_its_binding(results):
    result = results["expert-gates-first-expert"]
    assert result["status"] == "mismatch", result
    f = _first(result)
    assert f"{f['path']}:{f['line']}" == EXPECTED["expert-gates-first-expert"]["bug_line"], result["findings"]
    assert "`e0`" in f["message"] and "not consecutive shards" in f["message"], f["message"]


def test_positions_that_vary_by_device_lead_over_an_iota_every_device_computes_alike(results):
    result = results["band-rows-no-stride"]
    assert result["status"] == "mismatch", result
    f = _first(result)
    assert f"{f['path']}:{f['line']}" == EXPECTED["band-rows-no-stride"]["bug_line"], result["findings"]
    assert "`rows`" in f["message"], f["message"]
    # the select that uses the mask stays, tied, as the alternative
    assert any(g["tie"] == f["tie"] and g["line"] == 112 for g in result["findings"][1:]), result["findings"]
