"""The whole-program proof of a training step costs the same for every layer it has.

A training step is proved whole (its backward pass runs under the forward's scopes, so it is never
split into layers): every rule sees every layer's forward and backward terms at once, and a rule
whose matches multiply across layers (one that pairs every slice chain of one operand with every
chain of the other) makes the proof super-linear in depth. A rule of that kind once took 21.6 M
matches, 580 s and 7 GB in one saturation iteration of bench/'s two-layer training step. Counted
here, without timing: rule matches and e-graph tuples at the fixed point, for 1, 2 and 3 layers of
bench/styles/train_step.py at its tiny shape; the third layer may not cost much more than the second.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from model_package import programs_of

from equivci.capture.run import capture_model
from equivci.manifest import load_manifest
from equivci.prove.saturate import saturate

BENCH = Path(__file__).resolve().parents[2] / "bench"
MANIFEST = """version: 1
models:
  - name: train-step
    reference: models/train_step.py:forward_tiny
    distributed: models/train_step.py:forward_tiny_tp
    inputs: models/train_step.py:inputs_tiny
    mesh: {tp: 8}
"""


def _work(repo: Path, layers: int, monkeypatch) -> tuple[int, int]:
    """(rule matches, e-graph tuples) of the whole-program saturation with `layers` layers."""
    monkeypatch.setenv("EQUIVCI_BENCH_LAYERS", str(layers))  # read by bench/llama_tp.py in the capture child
    manifest = load_manifest(repo / "equivci.yaml")
    proof = saturate(programs_of(capture_model(manifest.models[0], manifest)))
    assert not proof.exhausted  # a fixed point: the counts are the whole search's
    matches = sum(proof.egraph.stats().num_matches_per_rule.values())
    return matches, sum(size for _, size in proof.egraph.all_function_sizes())


@pytest.mark.slow  # three captures and whole-program saturations of a training step (about a minute idle)
def test_a_training_step_costs_the_same_per_layer(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    for file in ("llama_tp.py", "styles/kit.py", "styles/train_step.py"):
        shutil.copy(BENCH / file, tmp_path / "models")
    (tmp_path / "equivci.yaml").write_text(MANIFEST)
    work = [_work(tmp_path, layers, monkeypatch) for layers in (1, 2, 3)]
    for unit, name in enumerate(("rule matches", "e-graph tuples")):
        one, two, three = (w[unit] for w in work)
        assert one < two < three, (name, work)
        # Each layer adds the same terms: the third may cost a little more than the second, not a multiple.
        assert three - two <= 1.25 * (two - one), (name, work)
