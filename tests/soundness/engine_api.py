"""Every engine internal the soundness tests use, imported in this one module.

The engine's modules move (equivci/verify/* is being split into terms, translation, proof and
diagnosis packages); when they do, only the imports below need repointing. Everything else in
tests/soundness and bench/verifier_mutants.py goes through these names or through the public
`equivci verify --format json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

# test_rules_numeric: the term builders of the rule tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "terms"))

from test_rules_numeric import (
    B,  # term builders that compute shapes the way the evaluator does
)

from equivci import cache as memo
from equivci.capture.oracle import compare_many_in_child  # the numeric oracle
from equivci.capture.run import capture_model
from equivci.hlo.parser import parse_module
from equivci.manifest import load_manifest
from equivci.options import Budgets
from equivci.prove.programs import build_programs
from equivci.prove.saturate import _run as run_rewrites
from equivci.prove.saturate import proved_equal
from equivci.terms.ir import Term
from equivci.terms.load import Loader
from equivci.terms.semantics import TermEvalError, evaluate
from equivci.terms.spec import reshape_spec
from equivci.translate import masks, routing
from equivci.verify import engine

__all__ = [
    "B", "Loader", "Term", "TermEvalError", "capture", "evaluate", "fingerprint_of", "memo", "oracle",
    "programs_of", "proved_equal", "recording_facts", "reshape_spec", "run_rewrites", "verify_captured",
]


def capture(manifest_path: Path, name: str):
    """The captured programs of one manifest model."""
    manifest = load_manifest(manifest_path)
    model = next(m for m in manifest.models if m.name == name)
    return capture_model(model, manifest)


def verify_captured(manifest_path: Path, name: str, captured, oracle: bool = False):
    """The engine's verdict on captured programs, in this process, without the cache; without the
    oracle a model that is not proved is `unproven` (no JAX child is started)."""
    manifest = load_manifest(manifest_path)
    model = next(m for m in manifest.models if m.name == name)
    budgets = Budgets() if oracle else dataclasses.replace(Budgets(), oracle_elements=-1)
    return engine.verify_model(model, manifest, captured, budgets=budgets)


def oracle(manifest_path: Path, names: list[str]) -> dict:
    """The numeric oracle's comparison of each model (both programs on random inputs on the fake
    mesh, one child process): name -> an object with `.equal`, or the error that stopped it."""
    return compare_many_in_child(manifest_path, names)


def programs_of(captured):
    """Both programs of a captured model as terms (the evaluator's facts included)."""
    return build_programs(parse_module(captured.reference_hlo), parse_module(captured.distributed_hlo),
                          captured.inputs, captured.outputs, captured.num_devices)


@contextlib.contextmanager
def recording_facts():
    """Record the facts the evaluator states without a rewrite rule while programs are built:
    tiled lookups (a psum of masked rows is the rows), tiled reduces (a max of window maxima is the
    max) and the routing lemma's (combine, gather) pairs. Yields a list of
    (kind, (evaluator, members[, the router]), result) filled as they are found."""
    found: list[tuple[str, object, Term]] = []
    lookup, reduce_, combine = masks.tiled_lookup, masks.tiled_reduce, routing.Router.combine

    def tiled_lookup(ev, members):
        out = lookup(ev, members)
        if out is not None:
            found.append(("lookup", (ev, list(members)), out))
        return out

    def tiled_reduce(ev, reducer, members):
        out = reduce_(ev, reducer, members)
        if out is not None:
            found.append((f"reduce-{reducer}", (ev, list(members)), out))
        return out

    def routed_combine(self, out, dev):
        before = len(self.facts)
        combine(self, out, dev)
        # with the router: every device's mask and index vector (the rows came through all of them)
        found.extend(("routing", (self.ev, [a], self), b) for a, b in self.facts[before:])

    masks.tiled_lookup, masks.tiled_reduce, routing.Router.combine = tiled_lookup, tiled_reduce, routed_combine
    try:
        yield found
    finally:
        masks.tiled_lookup, masks.tiled_reduce, routing.Router.combine = lookup, reduce_, combine


def fingerprint_of(package_dir: Path) -> str:
    """cache.fingerprint() as computed by a fresh interpreter importing the package at `package_dir`
    (its parent goes first on PYTHONPATH; -P keeps the working folder off sys.path)."""
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(package_dir.parent))
    code = "import equivci, equivci.cache as m; print(equivci.__file__); print(m.fingerprint())"
    out = subprocess.run([sys.executable, "-P", "-c", code], env=env, cwd=package_dir.parent, capture_output=True, text=True,
                         check=True).stdout
    where, value = out.split()
    assert Path(where).resolve().parent == package_dir.resolve(), (where, package_dir)
    return value
