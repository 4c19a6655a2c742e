"""Numeric oracle against the labelled zoo: every model of equivci.yaml, configs/buggy.yaml and
configs/zoo.yaml is run (reference and distributed, fake CPU mesh, random inputs, 3 seeds) and
must agree with its label: equivalent => equal on every seed; different => some seed differs
beyond tolerance. Models of the same manifest share one child process (two such children at once);
models tagged `slow` in their manifest run only with `-m slow`.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from equivci.capture.oracle import NumericComparison, compare_many_in_child, random_inputs
from equivci.errors import EquivciError
from equivci.testing.zoo import MANIFESTS, REPO, Case, cases, load_expected

SEEDS = (0, 1, 2)
CHILDREN = 2  # the suite's machine has two cores
ALL = cases()

_results: dict[tuple, dict] = {}


def _group_key(case: Case) -> tuple:
    # One child per manifest: it starts with the largest device count among the models, and
    # smaller meshes use the first devices. Slow models get their own child.
    return (case.manifest_rel, case.slow)


def _compare(key: tuple) -> None:
    group = [c for c in ALL if _group_key(c) == key]
    _results[key] = compare_many_in_child(group[0].manifest, [c.name for c in group], seeds=SEEDS, timeout=600)


def _result(case: Case) -> NumericComparison | EquivciError:
    key = _group_key(case)
    if key not in _results:
        # The first case asks for every group of its speed (slow ones only with -m slow), the
        # largest first, CHILDREN at once: one child works on one core.
        sizes = Counter(map(_group_key, ALL))
        keys = sorted((k for k in sizes if k[1] == case.slow), key=lambda k: -sizes[k])
        with concurrent.futures.ThreadPoolExecutor(CHILDREN) as pool:
            list(pool.map(_compare, keys))
    return _results[key][case.name]


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in ALL]
)
def test_numeric_oracle_matches_label(case: Case):
    result = _result(case)
    if isinstance(result, EquivciError):
        pytest.fail(f"{case.id}: the numeric check failed: {result}")
    if case.verdict == "equivalent":
        assert result.equal, f"{case.id} is labelled equivalent but {result.describe()}"
    else:
        assert not result.equal, (
            f"{case.id} is labelled different ({case.note}) but the outputs agree on seeds "
            f"{list(SEEDS)} (max |diff| {result.max_abs_diff:.3g}): the bug does not change the output"
        )
        assert result.failing_seeds, result


# --- static checks of the labels ------------------------------------------------------------------


def test_all_manifests_and_labels_exist():
    for rel, sidecar in MANIFESTS.items():
        assert (REPO / rel).is_file(), rel
        assert (REPO / sidecar).is_file(), sidecar


def test_labels_are_well_formed():
    for case in ALL:
        assert case.verdict in ("equivalent", "different"), case.id
        assert case.pattern, f"{case.id}: no pattern in its expected.yaml label"
        if case.verdict == "equivalent":
            assert case.bug_line is None, f"{case.id}: an equivalent model has no bug line"
        else:
            assert case.bug_line, f"{case.id}: a different model must name its bug line"
            path, _, line = case.bug_line.rpartition(":")
            text = (REPO / path).read_text().splitlines()[int(line) - 1]
            assert "# BUG:" in text, f"{case.id}: {case.bug_line} is not a `# BUG:` line: {text.strip()!r}"
            dist_file = case.model.distributed.file
            assert dist_file is not None and dist_file.resolve() == (REPO / path).resolve(), (
                f"{case.id}: the bug line {case.bug_line} is not in the distributed file {dist_file}"
            )


def test_every_zoo_pattern_has_a_correct_and_a_buggy_variant():
    verdicts: dict[str, set[str]] = {}
    for case in ALL:
        if case.manifest_rel == "configs/zoo.yaml":
            verdicts.setdefault(case.pattern, set()).add(case.verdict)
    assert len(verdicts) >= 14, sorted(verdicts)
    for pattern, seen in verdicts.items():
        assert seen == {"equivalent", "different"}, f"zoo pattern {pattern} has only {seen} variants"


def test_every_label_names_a_model_and_every_bug_is_labelled():
    names = {c.name for c in ALL}
    for sidecar in set(MANIFESTS.values()):
        for name in load_expected(sidecar):
            assert name in names, f"{sidecar}: label for unknown model '{name}'"
    labelled = {c.bug_line for c in ALL if c.bug_line}
    for path in sorted((REPO / "examples").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"#\s*BUG:", line):
                ref = f"{path.relative_to(REPO)}:{i}"
                assert ref in labelled, f"{ref} carries a `# BUG:` comment but no model is labelled with it"


# --- the oracle itself, on small hand-made manifests ----------------------------------------------

_ORACLE_MODELS = '''
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


def ints_ref(a):
    return {"total": jnp.sum(a, axis=0), "double": 2 * a}


def ints_dist(a, *, mesh):
    print('{"model": "ints-equal", "error": "user code printing to stdout must not confuse the parent"}')
    def body(a):
        return {"total": lax.psum(jnp.sum(a, axis=0), "x"), "double": 2 * a}
    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs={"total": P(), "double": P("x")})(a)


def ints_off_by_one(a, *, mesh):
    out = ints_dist(a, mesh=mesh)
    return {"total": out["total"], "double": out["double"].at[3, 1].add(1)}


def ints_inputs():
    return (jax.ShapeDtypeStruct((8, 4), jnp.int32),)


def f32_ref(x):
    return jnp.sum(x, axis=-1)


def bf16_dist(x, *, mesh):
    return jnp.sum(x, axis=-1).astype(jnp.bfloat16)


def f32_inputs():
    return (jax.ShapeDtypeStruct((4, 16), jnp.float32),)
'''

_ORACLE_MANIFEST = '''
version: 1
models:
  - {name: ints-equal, reference: m.py:ints_ref, distributed: m.py:ints_dist, inputs: m.py:ints_inputs, mesh: {x: 2}}
  - {name: ints-off, reference: m.py:ints_ref, distributed: m.py:ints_off_by_one, inputs: m.py:ints_inputs, mesh: {x: 2}}
  - {name: dtype-change, reference: m.py:f32_ref, distributed: m.py:bf16_dist, inputs: m.py:f32_inputs, mesh: {x: 2}}
'''


def test_oracle_exact_ints_leaf_paths_and_structural_differences(tmp_path: Path):
    (tmp_path / "m.py").write_text(_ORACLE_MODELS)
    (tmp_path / "equivci.yaml").write_text(_ORACLE_MANIFEST)
    res = compare_many_in_child(tmp_path / "equivci.yaml", ["ints-equal", "ints-off", "dtype-change", "nope"], seeds=(0, 1))
    assert isinstance(res["ints-equal"], NumericComparison) and res["ints-equal"].equal
    off = res["ints-off"]
    assert not off.equal and off.worst_leaf == "['double']" and off.worst_index == (3, 1)
    assert off.max_abs_diff == 1.0 and off.dist_value == off.ref_value + 1 and off.failing_seeds == (0, 1)
    dtype = res["dtype-change"]
    assert not dtype.equal and "dtype" in dtype.note
    assert isinstance(res["nope"], EquivciError) and "nope" in str(res["nope"])


@pytest.mark.parametrize(("dtype", "n", "top"), [("uint8", 256, 255), ("uint8", 300, 255), ("int8", 128, 127),
                                                  ("uint32", 500, 499), ("int32", 7, 6)])
def test_integer_inputs_are_drawn_over_their_whole_range_in_every_integer_dtype(dtype, n, top):
    """Ids in [0, n) reach both ends, and a dtype too narrow for n reaches its own max: a 256-row
    table indexed by uint8 ids gets id 255 (a bug in the last row is then seen)."""
    import jax  # (lazy, as in the oracle: the zoo tests above run JAX in children only)

    (drawn,) = random_inputs((jax.ShapeDtypeStruct((20_000,), dtype),), 0, {0: (0, n)})
    drawn = np.asarray(drawn)
    assert drawn.dtype == np.dtype(dtype) and drawn.min() == 0 and drawn.max() == top
