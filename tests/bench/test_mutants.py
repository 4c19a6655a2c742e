"""Mutation sweep (bench/mutants.py) as a test: mutants of correct models that the numeric oracle
shows different must never be `verified`.

The default suite runs every probe (configs/probes.yaml) and a two-model share of the sweep end to
end (real JAX, real egglog); the slow test runs a bigger subset; the fast ones pin down the mutation
machinery itself, in particular that a mutant never changes the reference.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_mutants", REPO / "bench" / "mutants.py")
mutants = sys.modules["bench_mutants"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(mutants)

# Small, fast models that between them exercise psum, all_gather, ppermute, axis_index slicing,
# range masks and a 2-D mesh.
SUBSET = ["mlp-sliced-tp", "ring-matmul", "mesh2d-dp-tp", "vocab-embed-tp"]
PER_MODEL = 4
SUBSET_DEFAULT = ["mlp-sliced-tp", "vocab-embed-tp"]

SHARED_HELPER = '''
from jax import lax


def _body(x, w):
    return lax.psum(x @ w, "tp") - 1


def reference(x, w):
    return _body(x, w)


def distributed(x, w, *, mesh):
    return _body(x, w)
'''


def _functions(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    return {n.name: ast.unparse(n) for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_mutants_change_only_the_distributed_code():
    sites = mutants.enumerate_sites(SHARED_HELPER, "distributed", ("tp",))
    ops = {s.op for s in sites}
    assert {"drop-collective", "arith-swap", "operand-swap", "int+-1", "collective-kind"} <= ops, ops
    original = _functions(SHARED_HELPER)
    for site in sites:
        funcs = _functions(mutants.mutant_source(SHARED_HELPER, "distributed", ("tp",), site))
        assert funcs["reference"] == original["reference"] and funcs["_body"] == original["_body"], site
        changed = {name for name in ("distributed", "_body__dist")
                   if funcs[name] != original[name.removesuffix("__dist")].replace("_body", "_body__dist")}
        assert changed == {site.func}, site
    assert len({mutants.mutant_source(SHARED_HELPER, "distributed", ("tp",), s) for s in sites}) == len(sites)


def test_axis_and_spec_operators_on_a_2d_mesh():
    source = '''
from jax import lax
from jax.sharding import PartitionSpec as P
TP = "tp"


def distributed(x, *, mesh):
    return lax.psum(x, TP), P(None, TP)
'''
    changes = {s.change for s in mutants.enumerate_sites(source, "distributed", ("dp", "tp"))}
    assert "lax.psum(x, TP) -> lax.psum(x, 'dp')" in changes
    assert "lax.psum(x, TP) -> lax.psum(x, ('dp', 'tp'))" in changes
    assert "lax.psum(x, TP) -> lax.psum(x, 'tp')" not in changes  # the axis it already has is no mutant
    assert any(c.endswith("P(None, None)") for c in changes) and any(c.endswith("P('dp', TP)") for c in changes)


def test_sampling_is_deterministic_and_spreads_over_operators():
    source = (REPO / "examples/zoo/ring.py").read_text()
    sites = mutants.enumerate_sites(source, "ring_matmul", ("tp",))
    a = mutants.sample_sites(sites, 6, "0:ring-matmul")
    assert a == mutants.sample_sites(sites, 6, "0:ring-matmul")
    assert len({s.op for s in a}) == 6


def _sweep_is_sound(models: list[str], per_model: int, work: Path) -> None:
    muts = mutants.sweep(models, per_model, seed=0, work=work, verify_timeout=120, log=lambda *_: None)
    lines: list[str] = []
    mutants.report(muts, out=lines.append)
    text = "\n".join(lines)
    unsound = [m.name for m in muts if mutants.is_unsound(m)]
    assert not unsound, text
    controls = [m for m in muts if m.site is None]
    assert len(controls) == len(models) and all(m.status == "verified" for m in controls), text
    # Not vacuous: the tool really judged mutants that compute something else.
    judged_different = [m for m in muts if m.oracle_verdict == "different" and m.status in ("mismatch", "unproven")]
    assert len(judged_different) >= len(models), text


def test_no_oracle_different_mutant_of_two_models_is_verified(tmp_path: Path):
    """The default suite's share of the sweep: two models, two mutants each."""
    _sweep_is_sound(SUBSET_DEFAULT, 2, tmp_path)


@pytest.mark.slow
def test_no_oracle_different_mutant_is_verified(tmp_path: Path):
    _sweep_is_sound(SUBSET, PER_MODEL, tmp_path)


def test_no_probe_is_verified():
    """configs/probes.yaml: variants whose difference the oracle cannot see (so the sweep above
    cannot judge them) and per-layer / per-iteration bugs; none but the control may be verified."""
    probes = mutants.run_probes(verify_timeout=120, oracle=False)  # the oracle's labels are not asserted
    lines: list[str] = []
    mutants.probe_report(probes, out=lines.append)
    text = "\n".join(lines)
    assert not [p.name for p in probes if p.unsound], text
    assert all(p.status == "verified" for p in probes if p.name in mutants.PROBES_EQUIVALENT), text
    assert all(p.status in ("mismatch", "unproven", "verified") for p in probes), text  # each one judged
