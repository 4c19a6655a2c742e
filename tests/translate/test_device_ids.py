"""partition-id and replica-id are unsigned 32-bit values (equivci/translate/literals.py): arithmetic
the evaluator folds on them wraps as XLA's u32 does."""

from __future__ import annotations

import pytest

from equivci.hlo.parser import parse_module
from equivci.terms.ir import TermTable
from equivci.translate.evaluator import Evaluator


# one replica: replica-id is 0 on every device
@pytest.mark.parametrize(("op", "want"), [("partition-id", ("4294967295", "0")), ("replica-id", ("4294967295",) * 2)])
def test_a_device_id_minus_one_wraps_around_as_u32(op, want):
    module = parse_module(f"""HloModule m

ENTRY main {{
  p = u32[] {op}()
  one = u32[] constant(1)
  ROOT d = u32[] subtract(p, one)
}}
""")
    ev = Evaluator(module, TermTable(), 2)
    values = ev.run(module.entry, [])
    assert [(t.op, t.dtype, t.attrs[0]) for t in values] == [("const", "u32", w) for w in want]
