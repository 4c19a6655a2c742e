"""The numpy semantics of terms (equivci/terms/semantics.py) on terms it cannot evaluate."""

from __future__ import annotations

import numpy as np
import pytest

from equivci.terms.ir import TermTable
from equivci.terms.semantics import TermEvalError, evaluate
from equivci.terms.spec import bcast_spec


@pytest.mark.parametrize("key", ["6b86b273ff34fce1", "elided:constant.3"])
def test_an_opaque_scalar_constant_is_not_evaluable(key):
    """A scalar known only by a content key (an unparsable or elided literal) has no value: the
    evaluator says so rather than failing to parse the key (numeric localization relies on it)."""
    opaque = TermTable().make("const", (key,), (), (), "f32")
    with pytest.raises(TermEvalError):
        evaluate(opaque, {})


def test_a_scalar_constant_has_its_terms_dtype():
    """A literal is rounded to its term's dtype as XLA does: 2**24 + 1 is not an f32, so x + c for
    x = 0 in f32 is 2**24 (in float64 it would be 2**24 + 1, a value no device computes)."""
    t = TermTable()
    c = t.make("const", ("16777217",), (), (), "f32")
    x = t.make("param", (0,), (), (2,), "f32")
    total = t.make("binary", ("add",), (x, t.make("bcast", (bcast_spec(0, (2,), ()),), (c,), (2,), "f32")), (2,), "f32")
    assert evaluate(c, {}).dtype == np.float32
    assert evaluate(total, {0: np.zeros(2, np.float32)}).tolist() == [16777216.0, 16777216.0]
    assert evaluate(t.make("const", ("1",), (), (), "pred"), {}).dtype == np.bool_


def test_select_takes_the_first_value_where_the_predicate_holds():
    """Rule instances evaluate both sides with these semantics, so a wrong select would agree with
    itself there: its meaning is checked against known values here."""
    t = TermTable()
    p, a, b = (t.make("param", (k,), (), (3,), dt) for k, dt in enumerate(("pred", "f32", "f32")))
    chosen = t.make("ternary", ("select",), (p, a, b), (3,), "f32")
    values = {0: np.array([True, False, True]), 1: np.array([1.0, 2.0, 3.0]), 2: np.array([-1.0, -2.0, -3.0])}
    assert evaluate(chosen, values).tolist() == [1.0, -2.0, 3.0]

