"""`related` (localization only) reaches the operand of a related reshape and the parts of a related
concatenation: a per-group piece of a reference value stated as reshape(concat(pieces)) is related,
so localization looks past it (equivci.terms.rules.relations)."""

from __future__ import annotations

from equivci.prove.saturate import is_related, saturate_terms
from equivci.terms.ir import TermTable


def test_the_pieces_of_a_reshaped_concatenation_are_related_and_other_values_are_not() -> None:
    table = TermTable()
    a = table.make("param", (0,), (), (4, 3), "f32")
    b = table.make("param", (1,), (), (4, 3), "f32")
    c = table.make("param", (2,), (), (4, 3), "f32")
    joined = table.make("concat", (0,), (a, b), (8, 3), "f32")
    grouped = table.make("reshape", ("1:>2:4;1:>1:",), (joined,), (2, 4, 3), "f32")
    other = table.make("unary", ("exponential",), (c,), (4, 3), "f32")
    proof = saturate_terms([grouped], [grouped], [], [], extra_terms=[a, b, other])
    assert is_related(proof, joined, {}) and is_related(proof, a, {}) and is_related(proof, b, {})
    assert not is_related(proof, other, {})
