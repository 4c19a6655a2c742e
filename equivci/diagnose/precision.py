"""Roundings the reference does not make: a float value converted to a narrower float.

Equivalence (the contract, ../shared/design.md) is the same function over real arithmetic with the
same dtypes; a value the distributed program rounds to bf16 where the reference keeps f32 changes a
dtype, so no proof relates it, however close the outputs stay. Such an op is named for what it is
(a changed precision, with both dtypes), not as a rule equivci might lack."""

from __future__ import annotations

from equivci.hlo.ir import WIDER, Instruction


def narrowing(inst: Instruction, operand: Instruction | None) -> tuple[str, str] | None:
    """(narrow, wide) where `inst` converts a `wide` float operand to the narrower float `narrow`."""
    if inst.opcode != "convert" or operand is None:
        return None
    narrow, wide = inst.shape.dtype, operand.shape.dtype
    return (narrow, wide) if wide in WIDER.get(narrow, ()) else None


def rounding_message(narrow: str, wide: str, partial: bool = False) -> str:
    held = "each device's share of a sum whose total" if partial else "a value"
    return (
        f"this `convert` rounds to {narrow} {held} the proof relates to the reference's {wide} values, and no "
        f"reference value is rounded so: from here the distributed program computes in lower precision than the "
        f"reference (a changed dtype, which `verified` does not claim)"
    )
