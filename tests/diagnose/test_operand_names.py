"""Operands named by their source expressions, never by HLO position ("operand 2")."""

from __future__ import annotations

import ast

from equivci.diagnose.localize import _operand_exprs


def _names(source: str, opcode: str, count: int) -> list[str] | None:
    exprs = _operand_exprs(ast.parse(source).body[0], opcode, count)
    return [ast.unparse(e) for e in exprs] if exprs is not None else None


def test_einsum_subscripts_passed_by_name_are_no_operand():
    assert _names("y = jnp.einsum(eq, a, b, preferred_element_type=f32).astype(bf16)", "dot", 2) == ["a", "b"]
    assert _names('y = jnp.einsum("ij,jk->ik", a, b)', "dot", 2) == ["a", "b"]
    # Near miss: three operands named after the subscripts are not a dot's two.
    assert _names("y = jnp.einsum(eq, a, b, c)", "dot", 2) is None


def test_where_operands_keep_their_literal_fill():
    assert _names("y = jnp.where(mask, scores, -jnp.inf)", "select", 3) == ["mask", "scores", "-jnp.inf"]
    assert _names("y = jnp.where(mask, scores, 0.0)", "select", 3) == ["mask", "scores", "0.0"]
