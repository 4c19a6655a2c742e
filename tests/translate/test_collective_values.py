"""Collectives as terms (equivci/translate/collectives.py): each device's result, evaluated, is what
the collective computes from every device's operand."""

from __future__ import annotations

import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.options import Budgets
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


FOUR = RNG.standard_normal((4, 4, 8)).astype(np.float32)  # four devices' [4, 8] operands
GROUPS = "replica_groups={{0,1},{2,3}}"  # two groups, so a value from the other group is wrong


def _collective(out: str, call: str) -> list[np.ndarray]:
    module = parse_module(f"""HloModule m

combine {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[4,8]{{1,0}} parameter(0)
  ROOT t = f32[{out}]{{1,0}} {call}
}}
""")
    table = TermTable()
    ev = Evaluator(module, table, 4)
    params = [table.make("param", (d,), (), (4, 8), "f32") for d in range(4)]
    return [evaluate(r, dict(enumerate(FOUR)), ev.values) for r in ev.run(module.entry, [params])]


def _expected(op: str, d: int) -> np.ndarray:
    g = [0, 1] if d < 2 else [2, 3]  # d's group
    pos = g.index(d)
    if op == "all-gather":
        return np.concatenate([FOUR[m] for m in g], axis=0)
    if op == "reduce-scatter":
        return (FOUR[g[0]] + FOUR[g[1]])[:, 4 * pos : 4 * pos + 4]
    if op == "all-to-all":  # device d's chunk pos of each member's dim 1, in group order
        return np.concatenate([FOUR[m][:, 4 * pos : 4 * pos + 4] for m in g], axis=1)
    source = {1: 0, 2: 1, 3: 2}  # collective-permute 0->1->2->3: device 0 receives nothing
    return FOUR[source[d]] if d in source else np.zeros((4, 8), np.float32)


@pytest.mark.parametrize(
    ("op", "out", "call"),
    [
        ("all-gather", "8,8", f"all-gather(x), channel_id=1, {GROUPS}, dimensions={{0}}, use_global_device_ids=true"),
        ("reduce-scatter", "4,4", f"reduce-scatter(x), channel_id=1, {GROUPS}, dimensions={{1}}, to_apply=combine"),
        ("all-to-all", "4,8", f"all-to-all(x), channel_id=1, {GROUPS}, dimensions={{1}}"),
        ("collective-permute", "4,8", "collective-permute(x), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3}}"),
    ],
)
def test_each_devices_collective_value(op, out, call):
    """Each device's result, evaluated, is the collective's definition over its group's operands
    (a device no pair sends to receives zeros)."""
    got = _collective(out, call)
    for d in range(4):
        np.testing.assert_allclose(got[d], _expected(op, d), rtol=1e-6, err_msg=f"device {d}")


def test_a_what_if_run_with_the_same_pairs_gives_the_same_terms_within_the_same_budgets():
    """Evaluator.variant (localization's re-run with other collective-permute pairs) builds with the
    run's budgets: with the pairs unchanged its results are the run's own terms, here with an iota
    the tight budget keeps symbolic."""
    module = parse_module("""HloModule m

ENTRY main {
  x = f32[4,8]{1,0} parameter(0)
  i = f32[4,8]{1,0} iota(), iota_dimension=1
  s = f32[4,8]{1,0} add(x, i)
  ROOT t = f32[4,8]{1,0} collective-permute(s), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3}}
}
""")
    table = TermTable()
    ev = Evaluator(module, table, 4, Budgets(fold_elements=4))
    params = [table.make("param", (d,), (), (4, 8), "f32") for d in range(4)]
    run = ev.run(module.entry, [params])
    assert ev.variant({"t": [(0, 1), (1, 2), (2, 3)]}) == run
    shifted = ev.variant({"t": [(1, 0), (2, 1), (3, 2)]})
    for d in range(4):
        want = FOUR[d + 1] + np.arange(8) if d < 3 else np.zeros((4, 8))
        np.testing.assert_allclose(evaluate(shifted[d], dict(enumerate(FOUR)), ev.values), want, rtol=1e-6)
