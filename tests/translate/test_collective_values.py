"""Collectives as terms (equivci/translate/collectives.py): each device's result, evaluated, is what
the collective computes from every device's operand."""

from __future__ import annotations

import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(4)
SHARDS = RNG.standard_normal((2, 4, 8)).astype(np.float32)


def _module(op: str, kept: str) -> str:
    return f"""HloModule m

combine {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] {op}(a, b)
}}

ENTRY main {{
  x = f32[4,8]{{1,0}} parameter(0)
  c = f32[] constant({"0" if op == "add" else "-inf"})
  r = f32[4]{{0}} reduce(x, c), dimensions={{1}}, to_apply=combine
  k = f32[{kept}]{{1,0}} reshape(r)
  ROOT t = f32[{kept}]{{1,0}} all-reduce(k), channel_id=1, replica_groups={{{{0,1}}}}, use_global_device_ids=true, to_apply=combine
}}
"""


@pytest.mark.parametrize(("op", "fn"), [("add", np.sum), ("maximum", np.max)])
@pytest.mark.parametrize("kept", ["4,1", "1,4"])
def test_an_all_reduce_of_reshaped_local_reductions(op, fn, kept):
    """keepdims after a local reduction, then the all-reduce: the reduction of every device's value."""
    module = parse_module(_module(op, kept))
    table = TermTable()
    params = [table.make("param", (d,), (), (4, 8), "f32") for d in range(2)]
    ev = Evaluator(module, table, 2)
    local = fn(SHARDS, axis=2)  # [device, row]
    want = (local.sum(0) if op == "add" else local.max(0)).reshape([int(n) for n in kept.split(",")])
    for result in ev.run(module.entry, [params]):
        got = evaluate(result, dict(enumerate(SHARDS)), ev.values)
        np.testing.assert_allclose(got, want, rtol=1e-6)
