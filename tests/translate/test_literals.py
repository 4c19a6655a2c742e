"""HLO literals and iotas as folded values (equivci/translate/literals.py): each takes its instruction's
dtype, as XLA stores it (0.1 in f32 is not 0.1 in f64)."""

from __future__ import annotations

import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.options import Budgets
from equivci.terms.ir import TermTable
from equivci.translate.evaluator import Evaluator


@pytest.mark.parametrize(
    ("hlo_type", "text", "want"),
    [
        ("f32[3]{0}", "{0.1, 0.2, 0.3}", np.array([0.1, 0.2, 0.3], np.float32)),
        ("s32[3]{0}", "{-4, 0, 7}", np.array([-4, 0, 7], np.int32)),
        ("u32[2]{0}", "{4294967295, 1}", np.array([4294967295, 1], np.uint32)),
        ("pred[3]{0}", "{true, false, true}", np.array([True, False, True])),
        ("f32[2,2]{1,0}", "{ { 1.5, -2 }, { 3, 4.25 } }", np.array([[1.5, -2], [3, 4.25]], np.float32)),
    ],
)
def test_an_array_literal_has_its_instructions_dtype(hlo_type, text, want):
    module = parse_module(f"HloModule m\n\nENTRY main {{\n  ROOT c = {hlo_type} constant({text})\n}}\n")
    ev = Evaluator(module, TermTable(), 1)
    (term,) = ev.run(module.entry, [])
    value = ev.folded(term)
    assert value is not None and value.dtype == want.dtype
    np.testing.assert_array_equal(value, want)


@pytest.mark.parametrize(("hlo_type", "dtype"), [("s32[2,3]{1,0}", np.int32), ("f32[2,3]{1,0}", np.float32)])
def test_a_folded_iota_has_its_instructions_dtype(hlo_type, dtype):
    module = parse_module(f"HloModule m\n\nENTRY main {{\n  ROOT i = {hlo_type} iota(), iota_dimension=1\n}}\n")
    ev = Evaluator(module, TermTable(), 1)
    (term,) = ev.run(module.entry, [])
    value = ev.folded(term)
    assert value is not None and value.dtype == dtype
    np.testing.assert_array_equal(value, np.broadcast_to(np.arange(3, dtype=dtype), (2, 3)))


def test_a_literal_past_the_fold_budget_is_a_symbolic_constant_named_by_its_content():
    """Weights-sized literals stay symbolic, with their instruction's shape and dtype: equal text is
    one term, other text another (elided ones: tests/translate/test_evaluator.py)."""
    module = parse_module(
        "HloModule m\n\nENTRY main {\n"
        "  a = f32[2,3]{1,0} constant({ { 1, 2, 3 }, { 4, 5, 6 } })\n"
        "  b = f32[2,3]{1,0} constant({ { 1, 2, 3 }, { 4, 5, 6 } })\n"
        "  c = f32[2,3]{1,0} constant({ { 1, 2, 3 }, { 4, 5, 7 } })\n"
        "  d = s32[2,3]{1,0} constant({ { 1, 2, 3 }, { 4, 5, 6 } })\n"
        "  ROOT t = (f32[2,3]{1,0}, f32[2,3]{1,0}, f32[2,3]{1,0}, s32[2,3]{1,0}) tuple(a, b, c, d)\n"
        "}\n"
    )
    ev = Evaluator(module, TermTable(), 1, Budgets(fold_elements=4))
    ((a, b, c, d),) = ev.run(module.entry, [])
    assert all(t.op == "const" and ev.folded(t) is None for t in (a, b, c, d))
    assert [(t.shape, t.dtype) for t in (a, c, d)] == [((2, 3), "f32"), ((2, 3), "f32"), ((2, 3), "s32")]
    assert a is b and a is not c and a is not d  # the same text in another dtype is another value
