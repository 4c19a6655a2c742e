"""A training step costs the same for every layer it has.

A training step whose layers are named scopes is proved by passes (equivci/layers/segments.py:
each layer's forward, then each layer's backward, one segment each, identical ones proved once), so
its proof work stops growing once the layers repeat: counted below as the layer proofs a deeper
step needs beyond those of a shallower one (none). Without scopes it is proved whole: every rule
sees every layer's forward and backward terms at once, and a rule
whose matches multiply across layers (one that pairs every slice chain of one operand with every
chain of the other) makes the proof super-linear in depth. A rule of that kind once took 21.6 M
matches, 580 s and 7 GB in one saturation iteration of bench/'s two-layer training step. Counted
here, without timing: rule matches and e-graph tuples at the fixed point, for 2 and 3 layers of a
small residual-MLP step (default suite) and for 1, 2 and 3 layers of bench/styles/train_step.py at its
tiny shape (slow); the third layer may not cost much more than the second. Not counted: a search that
scans a table without matching, the other way a rule's cost grows with depth (bench/STYLES.md times
the rules one by one).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from model_package import programs_of

from equivci.cache import Memo
from equivci.capture.run import capture_model
from equivci.manifest import load_manifest
from equivci.prove.saturate import saturate
from equivci.results import Status
from equivci.verify.engine import verify_model

BENCH = Path(__file__).resolve().parents[2] / "bench"
MANIFEST = """version: 1
models:
  - name: train-step
    reference: models/train_step.py:forward_tiny
    distributed: models/train_step.py:forward_tiny_tp
    inputs: models/train_step.py:inputs_tiny
    mesh: {tp: 8}
"""

# A small training step of the same kind (a residual MLP, Megatron TP inside shard_map, the gradient
# through it, an SGD update) at two depths, named in one manifest: one capture server for both.
MLP_STEP = """import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def layer(x, w1, w2, reduce=lambda t: t):
    return x + reduce(jax.nn.gelu(x @ w1) @ w2)


def sgd(forward, x, params):
    value, grads = jax.value_and_grad(lambda p: jnp.mean(forward(x, p) ** 2))(params)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value


def reference(n, x, params):
    def forward(x, params):
        for w1, w2 in params:
            x = layer(x, w1, w2)
        return x

    return sgd(forward, x, params)


def distributed(n, x, params, *, mesh):
    def body(x, params):
        for w1, w2 in params:
            x = layer(x, w1, w2, lambda t: jax.lax.psum(t, "tp"))
        return x

    specs = (P(), [(P(None, "tp"), P("tp", None))] * n)
    return sgd(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P()), x, params)


def inputs(n):
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return s(4, 16), [(s(16, 32), s(32, 16)) for _ in range(n)]


for n in (2, 3):
    globals()[f"step_{n}"] = functools.partial(reference, n)
    globals()[f"step_{n}_tp"] = functools.partial(distributed, n)
    globals()[f"inputs_{n}"] = functools.partial(inputs, n)
"""
def _manifest(module: str, depths: tuple[int, ...]) -> str:
    return "version: 1\nmodels:\n" + "".join(
        f"""  - name: step-{n}
    reference: models/{module}.py:step_{n}
    distributed: models/{module}.py:step_{n}_tp
    inputs: models/{module}.py:inputs_{n}
    mesh: {{tp: 8}}
"""
        for n in depths
    )


MLP_MANIFEST = _manifest("mlp_step", (2, 3))


# The same step with each layer under `jax.named_scope(f"layers_{i}")`, at three depths.
SCOPED_STEP = MLP_STEP.replace(
    """        for w1, w2 in params:
            x = layer(x, w1, w2)""",
    """        for i, (w1, w2) in enumerate(params):
            with jax.named_scope(f"layers_{i}"):
                x = layer(x, w1, w2)""",
).replace(
    """        for w1, w2 in params:
            x = layer(x, w1, w2, lambda t: jax.lax.psum(t, "tp"))""",
    """        for i, (w1, w2) in enumerate(params):
            with jax.named_scope(f"layers_{i}"):
                x = layer(x, w1, w2, lambda t: jax.lax.psum(t, "tp"))""",
).replace("for n in (2, 3):", "for n in (2, 4, 8):")
SCOPED_MANIFEST = _manifest("scoped_step", (2, 4, 8))


def _counts(captured) -> tuple[int, int]:
    """(rule matches, e-graph tuples) of the whole-program saturation of a captured step."""
    proof = saturate(programs_of(captured))
    assert not proof.exhausted  # a fixed point: the counts are the whole search's
    matches = sum(proof.egraph.stats().num_matches_per_rule.values())
    return matches, sum(size for _, size in proof.egraph.all_function_sizes())


def _work(repo: Path, layers: int, monkeypatch) -> tuple[int, int]:
    """(rule matches, e-graph tuples) of the whole-program saturation with `layers` layers."""
    monkeypatch.setenv("EQUIVCI_BENCH_LAYERS", str(layers))  # read by bench/llama_tp.py in the capture child
    manifest = load_manifest(repo / "equivci.yaml")
    return _counts(capture_model(manifest.models[0], manifest))


def test_the_third_layer_of_a_training_step_costs_no_more_than_the_first_two_on_average(tmp_path):
    """Two depths of a small step (the slow test below has three of bench/'s): with 2 layers the step
    costs its fixed part (loss, update) and two layers, so a third that costs much more than half of
    that is a layer whose cost grows with the depth."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mlp_step.py").write_text(MLP_STEP)
    (tmp_path / "equivci.yaml").write_text(MLP_MANIFEST)
    manifest = load_manifest(tmp_path / "equivci.yaml")
    two, three = (_counts(capture_model(m, manifest)) for m in manifest.models)
    for unit, name in enumerate(("rule matches", "e-graph tuples")):
        assert two[unit] < three[unit], (name, two, three)
        assert three[unit] - two[unit] <= 1.25 * two[unit] / 2, (name, two, three)


def test_a_training_step_by_layers_proves_nothing_new_for_more_identical_layers(tmp_path):
    """2, 4 and 8 layers of the scoped step, one memo: the passes split each into its layers' forward
    and backward segments, and every segment of the 8-layer step is one the 4-layer step proved
    (the first and last layers' segments differ from the middle ones, which are all alike)."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "scoped_step.py").write_text(SCOPED_STEP)
    (tmp_path / "equivci.yaml").write_text(SCOPED_MANIFEST)
    manifest = load_manifest(tmp_path / "equivci.yaml")
    memo = Memo(None)
    new = []
    for model in manifest.models:
        result = verify_model(model, manifest, capture_model(model, manifest), memo)
        assert result.status is Status.VERIFIED, result.findings
        n = int(model.name.split("-")[1])
        assert result.layers.total == 2 * n - 1  # forward and backward of each layer, the last one's paired
        new.append(result.layers.total - result.layers.reused)
    assert new[2] == 0, new
    assert new[1] <= new[0], new


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
