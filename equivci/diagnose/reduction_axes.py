"""An all-reduce over the wrong mesh axes: the axis a share of a sum awaits is not among those it sums.

A value that is each device's share of a sum over mesh axis A becomes the reference value only by a
sum over A. An all-reduce whose groups join no two devices of one A-group leaves that sum undone: if
its operand is the share, it adds up different parts of the reference (the axis is wrong); if its
own value still is a share over A and what uses it takes it as the whole, A is missing from its axes.
"""

from __future__ import annotations

from equivci.hlo.collectives import UnsupportedGroups, parse_groups
from equivci.hlo.ir import Instruction


def reduced_axes(inst: Instruction, groups_by_axis: dict[str, list[list[int]]], devices: int) -> set[str] | None:
    """The mesh axes along which the all-reduce `inst` adds at least two devices' values (None:
    groups it cannot read)."""
    try:
        groups = [set(g) for g in parse_groups(inst.attrs.get("replica_groups"), devices)]
    except UnsupportedGroups:
        return None
    return {
        axis for axis, lines in groups_by_axis.items() if any(len(g & set(line)) > 1 for g in groups for line in lines)
    }


def _axes(names: set[str]) -> str:
    return ", ".join(f"'{a}'" for a in sorted(names)) or "no mesh axis"


def wrong_axis(reduced: set[str], axis: str) -> str:
    return (
        f"this all-reduce sums over mesh axis {_axes(reduced)}, but its operand is each device's share of "
        f"a sum over mesh axis '{axis}', which it does not sum over: it adds up values that are different "
        f"parts of the reference's. The reduction should be over '{axis}'"
    )


def missing_axis(reduced: set[str], axis: str, use: Instruction | None, at: str) -> str:
    taken = (
        f"the `{use.opcode}` at {at} takes it as the whole value"
        if use is not None
        else "it is returned as the whole value"
    )
    return (
        f"this all-reduce sums over mesh axis {_axes(reduced)}, but its value is still each device's share "
        f"of a sum over mesh axis '{axis}' (only their sum over '{axis}' gives the reference's value, up to a "
        f"constant factor), and {taken}: '{axis}' is missing from the reduction's axes"
    )
