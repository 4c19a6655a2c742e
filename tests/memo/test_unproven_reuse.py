"""An unproven model's work is kept too (equivci.verify.prefix): a change after its first unproved
layer proves only the changed layer again, and takes the diagnosis up to that layer from the memo.

A real git repository in a temp folder with a layer stack whose first layer lacks its psum (a real
defect), captured by the real capture child after every edit; the verifier runs in this process
with a budget that sends it down the big-model path (the diagnosis up to the first unproved layer)
and without the numeric oracle, and the work is counted: layer proofs saturated, prefix proofs
saturated.
"""

from __future__ import annotations

import dataclasses
import subprocess
import textwrap
from pathlib import Path

import pytest

from equivci import cache
from equivci.cache import Memo
from equivci.capture.run import capture_model
from equivci.manifest import load_manifest
from equivci.options import Budgets
from equivci.prove import layered
from equivci.results import ModelResult, Status
from equivci.verify import prefix
from equivci.verify.engine import verify_model

SOURCE = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P


    def s(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)


    def inputs():
        return s(8, 16), [(s(16, 32), s(32, 16)) for _ in range(3)], s(16, 24)


    def head(h, w):
        with jax.named_scope("lm_head"):
            return jnp.tanh(h) @ w  # HEAD


    def reference(x, layers, w):
        for i, (w_in, w_out) in enumerate(layers):
            with jax.named_scope(f"layers_{i}"):
                x = jnp.tanh(x + jnp.tanh(x @ w_in) @ w_out)
        return head(x, w)


    def distributed(x, layers, w, *, mesh):
        def body(x, layers, w):
            for i, (w_in, w_out) in enumerate(layers):
                with jax.named_scope(f"layers_{i}"):
                    partial = jnp.tanh(x @ w_in) @ w_out
                    x = jnp.tanh(x + (partial if i == 0 else lax.psum(partial, "tp")))  # FIRST
            return head(x, w)

        specs = [(P(None, "tp"), P("tp", None)) for _ in range(3)]
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), specs, P()), out_specs=P(), check_vma=False)(
            x, layers, w
        )
    """)

MANIFEST = textwrap.dedent("""\
    version: 1
    models:
      - {name: stack, reference: stack.py:reference, distributed: stack.py:distributed,
         inputs: stack.py:inputs, mesh: {tp: 4}}
    """)

# Past 0 terms a model the layers do not prove is diagnosed up to its first unproved layer; the
# oracle is off (no input is small enough), so the verdict is `unproven` with the localization's finding.
BUDGETS = Budgets(whole_program_terms=0, oracle_elements=0)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=repo, check=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "stack.py").write_text(SOURCE)
    (repo / "equivci.yaml").write_text(MANIFEST)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "model")
    return repo


@pytest.fixture
def work(monkeypatch) -> dict:
    """Counts of the saturations run: layer proofs and prefix proofs."""
    counts: dict = {"layers": 0, "prefix": 0, "iterations": []}  # iterations: each prefix proof's budget

    def counted(name, function):
        def run(*args, **kwargs):
            counts[name] += 1
            if name == "prefix":
                counts["iterations"].append(args[1])
            return function(*args, **kwargs)

        return run

    monkeypatch.setattr(layered, "_prove", counted("layers", layered._prove))
    monkeypatch.setattr(prefix, "prefix_proof", counted("prefix", prefix.prefix_proof))
    return counts


def _edit(repo: Path, old: str, new: str) -> None:
    path = repo / "stack.py"
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    _git(repo, "commit", "-qam", "edit")


def _verify(repo: Path, memo: Memo) -> ModelResult:
    manifest = load_manifest(repo / "equivci.yaml")
    model = manifest.models[0]
    return verify_model(model, manifest, capture_model(model, manifest), memo, budgets=BUDGETS)


def _summary(result: ModelResult):
    return result.status, [(f.path, f.line, f.severity, f.message) for f in result.findings]


def test_a_change_after_the_first_unproved_layer_reuses_its_diagnosis(repo, work, tmp_path):
    memo = Memo(tmp_path / "cache")
    first = _verify(repo, memo)
    assert first.status is Status.UNPROVEN
    assert first.findings[0].line == SOURCE.splitlines().index(next(x for x in SOURCE.splitlines() if "FIRST" in x)) + 1
    assert work["prefix"] == 1 and work["layers"] >= 2
    assert any("prove up to the first unproved layer" == stage for stage, _ in first.timings)

    # The head changes (a layer after the first unproved one): only its proof is done again.
    _edit(repo, "return jnp.tanh(h) @ w  # HEAD", "return 2.0 * (jnp.tanh(h) @ w)  # HEAD")
    before = dict(work)
    changed = _verify(repo, Memo(tmp_path / "cache"))  # a new run: the memo on disk
    assert work["layers"] - before["layers"] == 1
    assert work["prefix"] == before["prefix"]
    assert any("(from the memo)" in stage for stage, _ in changed.timings)
    assert changed.layers.reused == changed.layers.total - 1
    # Exactly what a run without the memo says about the changed model.
    fresh = _verify(repo, Memo(None))
    assert _summary(changed) == _summary(fresh) == _summary(first)


def test_a_change_inside_the_prefix_diagnoses_it_again(repo, work, tmp_path):
    """Near miss: the first layer's defect moves (a psum that halves it): the prefix is re-proved
    and the finding follows, as without the memo."""
    _verify(repo, Memo(tmp_path / "cache"))
    _edit(repo, "(partial if i == 0 else", "(0.5 * lax.psum(partial, 'tp') if i == 0 else")
    before = dict(work)
    changed = _verify(repo, Memo(tmp_path / "cache"))
    assert work["prefix"] - before["prefix"] == 1
    assert not any("(from the memo)" in stage for stage, _ in changed.timings)
    assert _summary(changed) == _summary(_verify(repo, Memo(None)))


def test_a_comment_in_another_function_keeps_the_diagnosis_one_in_its_statement_does_not(repo, work, tmp_path):
    """The source the localization reads is part of the key: the top-level statements spanning the
    prefix's lines, not the rest of the file."""
    _verify(repo, Memo(tmp_path / "cache"))
    _edit(repo, "return jnp.tanh(h) @ w  # HEAD", "return jnp.tanh(h) @ w  # HEAD, unchanged")
    before = dict(work)
    _verify(repo, Memo(tmp_path / "cache"))
    assert work["prefix"] == before["prefix"]
    # Same lines, another text in the function of the first layer's ops (the localization reads it).
    _edit(repo, "for _ in range(3)]\n    return", "for _ in range(3)]  # the weights\n    return")
    _verify(repo, Memo(tmp_path / "cache"))
    assert work["prefix"] == before["prefix"] + 1


def test_another_engine_reuses_nothing(repo, work, tmp_path, monkeypatch):
    """A rule changed is a source of equivci changed: its fingerprint is in every key."""
    first = _verify(repo, Memo(tmp_path / "cache"))
    before = dict(work)
    monkeypatch.setattr(cache, "_FINGERPRINT", cache.key("another engine"))
    again = _verify(repo, Memo(tmp_path / "cache"))
    assert work["prefix"] - before["prefix"] == 1
    assert work["layers"] - before["layers"] == before["layers"]
    assert again.layers.reused == first.layers.reused  # only the run's own identical layers
    assert _summary(again) == _summary(first)


def test_another_budget_reuses_nothing(repo, work, tmp_path):
    """The saturation budget and every other budget are in the keys of layers and diagnoses."""
    manifest = load_manifest(repo / "equivci.yaml")
    model = manifest.models[0]
    captured = capture_model(model, manifest)
    verify_model(model, manifest, captured, Memo(tmp_path / "cache"), budgets=BUDGETS)
    done = dict(work)
    verify_model(model, manifest, captured, Memo(tmp_path / "cache"), iterations=121, budgets=BUDGETS)
    assert (work["prefix"], work["layers"]) == (2 * done["prefix"], 2 * done["layers"])
    assert work["iterations"] == [120, 121]  # the prefix proof runs with the budget asked for
    other = dataclasses.replace(BUDGETS, layer_windows=63)
    verify_model(model, manifest, captured, Memo(tmp_path / "cache"), budgets=other)
    assert (work["prefix"], work["layers"]) == (3 * done["prefix"], 3 * done["layers"])


def test_a_prefix_with_a_collective_permute_is_not_kept(repo, work, tmp_path):
    """Near miss of the guard: the same model with the first layer's psum replaced by a ppermute
    (a real defect too). Its localization tries the permutation's pairs sent another way, which
    runs the whole program again: the diagnosis depends on more than the prefix, so it is never
    kept, and every run diagnoses it anew (with the same finding)."""
    _edit(
        repo,
        "(partial if i == 0 else",
        "(lax.ppermute(partial, 'tp', [(k, (k + 1) % 4) for k in range(4)]) if i == 0 else",
    )
    first = _verify(repo, Memo(tmp_path / "cache"))
    assert first.status is not Status.VERIFIED
    again = _verify(repo, Memo(tmp_path / "cache"))
    assert work["prefix"] == 2
    assert _summary(again) == _summary(first)
