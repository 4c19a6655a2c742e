"""Sorts and top-k in the evaluator (Evaluator.sort, Evaluator.top_k): a stable sort along one dim is
an aligned map over the other dims, with the numpy model of terms/semantics.sort_lanes; a top-k is
the first k of the stable descending sort of (x, iota); an unstable sort stays opaque."""

from __future__ import annotations

import numpy as np

from equivci.hlo.parser import parse_module
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import AlignedMap
from equivci.translate.evaluator import Evaluator

COMPARATORS = """
%less (a: s32[], b: s32[], c: s32[], d: s32[]) -> pred[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}

%less1 (a: s32[], b: s32[]) -> pred[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}

"""


def _run(entry: str, params: list[tuple[tuple[int, ...], str]]):
    module = parse_module(f"HloModule m\n{COMPARATORS}\nENTRY %main {{\n{entry}\n}}\n")
    table = TermTable()
    terms = [table.make("param", (k,), (), shape, dtype) for k, (shape, dtype) in enumerate(params)]
    ev = Evaluator(module, table, 1)
    return ev.run(module.entry, [[t] for t in terms])[0], ev


def test_stable_argsort_is_an_aligned_sort_with_the_numpy_model():
    keys, ev = _run(
        """  %k = s32[3,6] parameter(0)
  %i = s32[3,6] iota(), iota_dimension=1
  %s = (s32[3,6], s32[3,6]) sort(%k, %i), dimensions={1}, is_stable=true, to_apply=%less
  ROOT %p = s32[3,6] get-tuple-element(%s), index=1""",
        [((3, 6), "s32")],
    )
    assert keys.op == "aligned" and AlignedMap.op_key(keys.attrs[0]) == "sort:LT:1:1"
    x = np.array([[3, 1, 3, 0, 1, 2], [5, 5, 5, 5, 5, 5], [2, 0, 1, 0, 2, 1]], dtype=np.int32)
    assert np.array_equal(evaluate(keys, {0: x}, ev.values), np.argsort(x, axis=1, kind="stable"))


def test_an_unstable_sort_stays_opaque():
    out, ev = _run(
        """  %k = s32[6] parameter(0)
  %i = s32[6] iota(), iota_dimension=0
  %s = (s32[6], s32[6]) sort(%k, %i), dimensions={0}, to_apply=%less
  ROOT %p = s32[6] get-tuple-element(%s), index=1""",
        [((6,), "s32")],
    )
    assert out.op == "gte" and out.args[0].op == "opaque"


def test_top_k_is_the_first_k_of_the_descending_sort_ties_in_index_order():
    top, ev = _run(
        """  %x = f32[2,5] parameter(0)
  %t = (f32[2,5], s32[2,5]) topk(%x), k=2, largest=true
  ROOT %i = s32[2,2] get-tuple-element(%t), index=1""",
        [((2, 5), "f32")],
    )
    assert top.op == "slice" and top.args[0].op == "aligned"
    assert AlignedMap.op_key(top.args[0].attrs[0]) == "sort:GT:1:1"
    x = np.array([[0.5, 2.0, 2.0, -1.0, 0.0], [1.0, 1.0, 1.0, 3.0, 1.0]], dtype=np.float32)
    assert np.array_equal(evaluate(top, {0: x}, ev.values), [[1, 2], [3, 0]])


def test_a_sort_of_constants_is_folded():
    out, ev = _run(
        """  %k = s32[5] constant({3, 1, 4, 1, 5})
  %i = s32[5] iota(), iota_dimension=0
  %s = (s32[5], s32[5]) sort(%k, %i), dimensions={0}, is_stable=true, to_apply=%less
  ROOT %p = s32[5] get-tuple-element(%s), index=1""",
        [],
    )
    assert np.array_equal(ev.folded(out), [1, 3, 0, 2, 4])


def test_a_one_operand_sort_is_paired_with_itself():
    out, ev = _run(
        """  %x = s32[2,4] parameter(0)
  ROOT %s = s32[2,4] sort(%x), dimensions={0}, is_stable=true, to_apply=%less1""",
        [((2, 4), "s32")],
    )
    assert out.op == "aligned" and out.args[0] is out.args[1]
    x = np.array([[3, 1, 0, 2], [1, 1, 4, 0]], dtype=np.int32)
    assert np.array_equal(evaluate(out, {0: x}, ev.values), np.sort(x, axis=0))
