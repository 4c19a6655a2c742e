"""The facts the evaluator states without a rewrite rule, checked numerically like the rules: a psum
of masked window lookups is the full lookup (vocabulary parallelism), a max of window maxima is the
max, and the routing lemma's combine is the gather of the dense expert outputs, for every index
vector (given each device's dispatch mask for it). Each fact found while the correct near-miss models are built is evaluated on random inputs
(equivci/terms/semantics.py), with the evaluator's folded constants; a routing fact for several random
index vectors drawn inside the bounds the lemma enumerated."""

from __future__ import annotations

import numpy as np
import pytest
from engine_api import capture, evaluate, programs_of, recording_facts
from near_miss_cases import MANIFEST

MODELS = {"embed-ge-lt": "lookup", "embed-gt-le": "lookup", "pmax-of-max": "reduce-maximum", "moe-ep": "routing"}


def _inputs(captured, rng) -> dict[int, np.ndarray]:
    out = {}
    for k, leaf in enumerate(captured.inputs):
        if "int" in leaf.dtype:  # ids: valid rows of the table, the domain the proof assumes
            out[k] = rng.integers(0, captured.inputs[0].shape[0], leaf.shape).astype(np.int32)
        else:
            out[k] = rng.standard_normal(leaf.shape)
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_facts_hold_numerically(name):
    captured = capture(MANIFEST, name)
    with recording_facts() as facts:
        programs_of(captured)
    kinds = {kind for kind, _, _ in facts}
    assert MODELS[name] in kinds, (name, kinds)  # the model exercises the fact it is here for
    rng = np.random.default_rng(0)
    for kind, (ev, members, *index), result in facts:
        for _ in range(4):
            consts = dict(ev.values)
            for router in index:  # any index vectors inside their bounds: the lemma holds for all of them
                for mask in router.dispatched.values():
                    lo, hi = ev.bounds_of(mask.index)
                    q = rng.integers(int(lo), int(hi) + 1, mask.index.shape).astype(np.int32)
                    # the mask as a function of q is what the lemma enumerated (its cumsum has no
                    # numpy model here); the claim checked is the combine, given the masks
                    consts[mask.index] = q
                    consts[mask.term] = router.evaluate(mask.term, {mask.index: q})
            params = _inputs(captured, rng)
            values = [np.asarray(evaluate(m, params, consts), dtype=np.float64) for m in members]
            if kind == "lookup":
                lhs = sum(values)
            elif kind.startswith("reduce-"):
                lhs = np.maximum.reduce(values) if kind == "reduce-maximum" else np.minimum.reduce(values)
            else:
                lhs = values[0]
            rhs = evaluate(result, params, consts)
            assert np.allclose(lhs, rhs, rtol=1e-6, atol=1e-6), (name, kind)
