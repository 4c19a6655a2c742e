"""tests/forked_captures.py, which most tests capture through, gives the programs a fresh capture
child gives: the same HLO text (source locations and stack frames included), leaves and flags."""

from __future__ import annotations

import dataclasses

import forked_captures

from equivci.capture.run import capture_model
from equivci.manifest import load_manifest
from equivci.testing.zoo import REPO

MANIFEST = REPO / "tests/soundness/near_miss.yaml"


def _fields(captured) -> dict:
    return {f.name: getattr(captured, f.name) for f in dataclasses.fields(captured) if f.name != "timings"}


def test_a_forked_capture_is_a_fresh_capture(monkeypatch):
    manifest = load_manifest(MANIFEST)
    # one model partitioned in the capture's compile (jit's SPMD dump read back), one not
    models = [m for m in manifest.models if m.name in ("embed-gt-drops-first", "concat-straddle")]
    forked = forked_captures.capture_all([(m, manifest) for m in models], workers=2)
    fresh = [capture_model(m, manifest) for m in models]
    assert {c.partitioned_early for c in fresh} == {True, False}
    for a, b in zip(forked, fresh):
        assert _fields(a) == _fields(b), a.name
    first = forked_captures._server["proc"].pid
    # another environment: a server started under it (jax reads some variables at import)
    monkeypatch.setenv("EQUIVCI_FORKED_CAPTURES_TEST", "1")
    again = forked_captures.capture(models[0], manifest)
    assert forked_captures._server["proc"].pid != first and _fields(again) == _fields(fresh[0])
