"""Windows proposed by concrete values (equivci/prove/candidates.py): hints that let a proof meet a
device's value from the reference's side; only the proof decides."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soundness"))

from engine_api import capture, programs_of  # noqa: E402

from equivci.diagnose.numeric import draw_inputs  # noqa: E402
from equivci.prove.candidates import window_candidates  # noqa: E402
from equivci.prove.saturate import MAX_ITERATIONS, saturate, with_hints  # noqa: E402

MANIFEST = Path(__file__).resolve().parents[1] / "soundness" / "near_miss.yaml"


@pytest.fixture(scope="module")
def rope():
    captured = capture(MANIFEST, "rope-table-rows")
    return captured, programs_of(captured)


def test_proposed_windows_complete_a_proof_the_rules_alone_do_not_find(rope):
    captured, programs = rope
    proof = saturate(programs)
    assert not proof.all_proved  # the rotation's windows nest in another order on a device
    hints = window_candidates(programs.reference_events, programs.distributed_events, programs.evaluator,
                              draw_inputs(captured.inputs))
    assert hints and all(t.op in ("slice", "reshape") for t in hints)
    assert with_hints(proof, programs, hints, MAX_ITERATIONS).all_proved


def test_near_miss_proposals_on_a_wrong_window_prove_nothing():
    """q rotated with the table's rows one position late: the values still propose windows (of the
    other values they match), and the proof with them fails."""
    captured = capture(MANIFEST, "rope-table-rows-shifted")
    programs = programs_of(captured)
    hints = window_candidates(programs.reference_events, programs.distributed_events, programs.evaluator,
                              draw_inputs(captured.inputs))
    assert hints
    assert not with_hints(saturate(programs), programs, hints, MAX_ITERATIONS).all_proved
