"""The numpy semantics of terms (equivci/terms/semantics.py) on terms it cannot evaluate."""

from __future__ import annotations

import pytest

from equivci.terms.ir import TermTable
from equivci.terms.semantics import TermEvalError, evaluate


@pytest.mark.parametrize("key", ["6b86b273ff34fce1", "elided:constant.3"])
def test_an_opaque_scalar_constant_is_not_evaluable(key):
    """A scalar known only by a content key (an unparsable or elided literal) has no value: the
    evaluator says so rather than failing to parse the key (numeric localization relies on it)."""
    opaque = TermTable().make("const", (key,), (), (), "f32")
    with pytest.raises(TermEvalError):
        evaluate(opaque, {})
