"""Every near-miss pair through the public entry point, `equivci verify --format json`, on a fresh
cache: buggy variants are never `verified` (and `mismatch` where the oracle shows the difference),
correct ones are `verified`. Each buggy variant differs from a correct one only where one side
condition of the verifier matters (see bench/verifier_mutants.py for which guard each protects).
The default suite runs the DEFAULT share of near_miss_cases.py, `-m slow` the rest; the module's
fixture verifies, in one run, the models of the tests selected.
"""

from __future__ import annotations

import pytest
from near_miss_cases import DEFAULT, EXPECTED, MANIFEST, agrees

from equivci.testing.zoo import REPO

ROUTING_LIMIT = "moe-ep-past-enumeration"


def _models_asked_for(items) -> set[str]:
    names = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "name" in callspec.params:
            names.add(callspec.params["name"])
        elif item.name == "test_routing_limit_is_named":
            names.add(ROUTING_LIMIT)
    return names


@pytest.fixture(scope="module")
def results(request, verify_once) -> dict[str, dict]:
    """The verdicts of the models the selected tests of this module ask about, from one run (one per
    session, on a fresh cache: tests/conftest.py; every xdist worker collects every selected test)."""
    names = sorted(_models_asked_for(i for i in request.session.items if i.module is request.module))
    run = verify_once(MANIFEST, names, cwd=REPO, timeout=900)
    assert run.code in (0, 1), run.stderr[-2000:]
    assert set(run.models) == set(names)
    return run.models


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in EXPECTED])
def test_near_miss_verdict(results, name):
    result = results[name]
    assert agrees(name, result["status"]), (name, EXPECTED[name], result["status"], result["findings"])
    if result["status"] == "mismatch":
        assert any("counterexample" in f["message"] for f in result["findings"]), result["findings"]


@pytest.mark.slow
def test_routing_limit_is_named(results):
    """A correct MoE layer past the routing lemma's enumeration limit (16 tokens per device) is
    `unproven`, and its finding says the limit was the reason."""
    result = results[ROUTING_LIMIT]
    assert result["status"] == "unproven", result
    messages = " ".join(f["message"] for f in result["findings"])
    assert any(word in messages for word in ("enumerat", "4096", "limit")), messages


def test_every_near_miss_model_has_an_expected_verdict():
    from equivci.manifest import load_manifest

    assert {m.name for m in load_manifest(MANIFEST).models} == set(EXPECTED)
    assert DEFAULT <= set(EXPECTED)
    # the default share keeps each kind of verdict
    assert {EXPECTED[n] for n in DEFAULT} == {"verified", "mismatch", "not verified"}


def test_no_model_file_defines_a_name_twice():
    """The models are appended by many hands to one file: a second top-level definition of a name
    silently replaces the first for every model that reads it (an inputs function, a helper), and
    ruff says nothing when the first was used."""
    import ast

    for path in sorted((MANIFEST.parent / "models").glob("*.py")):
        seen: dict[str, int] = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                assert name not in seen, f"{path.name}: {name} defined at lines {seen[name]} and {node.lineno}"
                seen[name] = node.lineno
