"""The third-party corpus (corpus/): labels consistent with the manifest and the planted bugs,
adapters that import and trace (fast), and the numeric oracle confirming every label (slow).

The adapters need the `corpus` extra (penzai, gemma, optax); without it the tracing and oracle
tests skip with the reason, the consistency test still runs.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "corpus"
sys.path.insert(0, str(CORPUS))
import numeric_check  # noqa: E402 (corpus/ is put on the path first)

MODELS = numeric_check.load_models()
EXPECTED = numeric_check.load_expected()
MISSING = [name for name in ("penzai", "gemma", "optax", "flax") if importlib.util.find_spec(name) is None]
needs_extra = pytest.mark.skipif(bool(MISSING), reason=f"corpus extra not installed (missing {', '.join(MISSING)}): "
                                 "pip install -e '.[corpus]' && pip install --no-deps gemma==4.0.1")


def test_manifest_and_labels_name_the_same_models():
    names = [m["name"] for m in MODELS]
    assert len(names) == len(set(names))
    assert set(names) == set(EXPECTED)


def test_every_entrypoint_names_a_function_defined_in_the_corpus():
    for model in MODELS:
        for key in ("reference", "distributed", "inputs"):
            file, func = model[key].split(":")
            source = (CORPUS / file).read_text()
            assert re.search(rf"^def {func}\(", source, re.MULTILINE), f"{model['name']}: {model[key]}"


def _bug_comment_lines() -> set[str]:
    found = set()
    for path in sorted(CORPUS.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "# BUG:" in line:
                found.add(f"{path.relative_to(ROOT)}:{number}")
    return found


def test_buggy_cases_point_at_their_bug_comment_and_each_bug_is_used_once():
    bug_lines = [label["bug_line"] for label in EXPECTED.values() if not label["equivalent"]]
    assert all(label["bug_line"] is None for label in EXPECTED.values() if label["equivalent"])
    assert len(bug_lines) == len(set(bug_lines))
    assert set(bug_lines) == _bug_comment_lines()


def test_the_corpus_meets_the_size_the_issue_asks_for():
    equivalent = sum(label["equivalent"] for label in EXPECTED.values())
    libraries = {m["tags"][0] for m in MODELS}
    assert equivalent >= 8 and len(EXPECTED) - equivalent >= 6 and len(libraries) >= 2


@needs_extra
def test_adapters_trace_with_matching_output_shapes():
    rows = numeric_check.trace()
    assert set(rows) == set(EXPECTED)
    for name, row in rows.items():
        assert "error" not in row, (name, row.get("error"))
        assert row["reference"] == row["distributed"], name


@pytest.mark.slow
@needs_extra
def test_numeric_oracle_confirms_every_label():
    results = numeric_check.check(seeds=2)
    assert len(results) == len(EXPECTED)
    unconfirmed = {r.name: (r.error, r.rel_diffs) for r in results if not r.confirmed}
    assert not unconfirmed
