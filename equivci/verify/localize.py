"""Point at the distributed op where the two programs part ways.

Each distributed value is classified per device: *related* (equal to a slice of some reference
value), *partial* (not itself, but its sum over the devices of one mesh axis is related: a value
waiting for its all-reduce) or *unrelated*. The finding is the first op, in program order, that is
unrelated although its operands are related or partial; a partial value that reaches an output is
a missing reduction. When an unrelated op combines slices whose offsets do not follow the device
order, the op that cut the slice is where the defect was made.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from equivci.hlo.ir import Instruction
from equivci.verify.instantiate import Event
from equivci.verify.prove import Proof, add_terms, is_related
from equivci.verify.terms import Term

TRIVIAL_OPS = {"parameter", "copy", "tuple", "get-tuple-element", "call", "opt-barrier", "custom-call", "bitcast",
               "constant", "partition-id", "replica-id", "iota"}


@dataclasses.dataclass(frozen=True)
class Defect:
    inst: Instruction
    message: str
    context: Instruction | None = None


def _terms(event: Event) -> list[Term] | None:
    if any(isinstance(v, tuple) for v in event.values):
        return None
    return list(event.values)


def axis_sums(evaluator, values: list[Term], groups_by_axis: dict[str, list[list[int]]]) -> dict[str, list[Term]]:
    """For each mesh axis, the sum of the value over that axis's device groups, per device."""
    out = {}
    for axis, groups in groups_by_axis.items():
        per_device: list[Term | None] = [None] * len(values)
        for group in groups:
            acc = values[group[0]]
            for dev in group[1:]:
                if values[dev].shape != acc.shape or values[dev].dtype != acc.dtype:
                    break
                acc = evaluator.binary("add", acc, values[dev])
            for dev in group:
                per_device[dev] = acc
        if all(t is not None for t in per_device):
            out[axis] = per_device
    return out


def param_slices(term: Term, limit: int = 400) -> set[tuple[int, int, int, int]]:
    """(input leaf, dim, start, stop) of every slice of a reference input inside `term`."""
    found, stack, seen = set(), [term], set()
    while stack and len(seen) < limit:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.op == "slice" and t.args[0].op == "param":
            found.add((t.args[0].attrs[0], t.attrs[0], t.attrs[1], t.attrs[2]))
        stack.extend(t.args)
    return found


def misplaced_slice(events: list[Event], operands: list[list[Term]]) -> tuple[Event, str] | None:
    """The op that cut a slice whose offsets across devices are out of device order."""
    if not operands or any(len(op) != len(operands[0]) for op in operands):
        return None
    per_device = [set().union(*(param_slices(op[dev]) for op in operands)) for dev in range(len(operands[0]))]
    by_key: dict[tuple[int, int], list[list[tuple[int, int]]]] = {}
    for dev, slices in enumerate(per_device):
        for leaf, dim, start, stop in slices:
            by_key.setdefault((leaf, dim), [[] for _ in per_device])[dev].append((start, stop))
    for (leaf, dim), ranges in by_key.items():
        if any(len(r) != 1 for r in ranges):
            continue
        spans = list(dict.fromkeys(r[0] for r in ranges))
        # Shards of one tensor, in the order devices first hold them, tile a contiguous range
        # (devices that differ only along another mesh axis hold the same shard).
        if any(prev[1] != cur[0] for prev, cur in zip(spans, spans[1:])):
            target = {(leaf, dim) + ranges[dev][0] for dev in range(len(ranges))}
            for event in events:
                terms = _terms(event)
                if terms and any(t.op == "slice" and t.args[0].op == "param"
                                 and (t.args[0].attrs[0], t.attrs[0], t.attrs[1], t.attrs[2]) in target for t in terms):
                    shown = ", ".join(f"[{a}:{b})" for (a, b), in ranges)
                    return event, (f"this slice of input #{leaf} along dim {dim} takes {shown} on devices "
                                   f"0..{len(ranges) - 1}: these are not consecutive shards in device "
                                   "order (overlapping, out of order or with gaps), so the devices do not hold the "
                                   "parts the other operand expects")
    return None


def first_defect(events: list[Event], proof: Proof, evaluator, groups_by_axis: dict[str, list[list[int]]],
                 output_terms: set[int]) -> Defect | None:
    status: dict[int, str] = {}  # id(term) -> related | partial | unrelated
    constants = evaluator.values
    loader = proof.loader

    def classify(values: list[Term]) -> str:
        key = id(values[0])
        if key in status:
            return status[key]
        if all(is_related(proof, t, constants) for t in values):
            result = "related"
        else:
            result = "unrelated"
        status[key] = result
        return result

    defined: dict[int, Event] = {}
    by_name = {event.inst.name: event for event in events}
    for event in events:
        terms = _terms(event)
        if terms is None or id(terms[0]) in defined:
            continue
        defined[id(terms[0])] = event
        if event.inst.opcode in TRIVIAL_OPS or terms[0] not in loader.exprs:
            continue
        if classify(terms) == "related":
            continue
        sums_by_axis = axis_sums(evaluator, terms, groups_by_axis)
        add_terms(proof, [t for sums in sums_by_axis.values() for t in sums])
        partial_axes = [axis for axis, sums in sums_by_axis.items()
                        if all(is_related(proof, t, constants) for t in sums)]
        if partial_axes:
            status[id(terms[0])] = "partial"
            if id(terms[0]) in output_terms:
                return Defect(event.inst, f"this value is a partial sum over mesh axis '{partial_axes[0]}' but it is "
                                          "returned as the full value: a psum (all-reduce) over that axis is missing")
            continue
        operand_events = [by_name.get(name) for name in event.inst.operands]
        if event.inst.opcode == "all-reduce" and operand_events and operand_events[0] is not None \
                and status.get(id(_terms(operand_events[0])[0])) == "related":
            return Defect(event.inst, "this all-reduce sums a value that is already the full reference value on every "
                                      "device, which multiplies it by the group size: the value was reduced before; "
                                      "remove one of the two reductions")
        slip = misplaced_slice(events, [list(e.values) for e in operand_events if e and _terms(e)])
        if slip is not None:
            return Defect(slip[0].inst, slip[1], context=event.inst)
        return Defect(event.inst, f"`{event.inst.opcode}` here gives a value that is not a slice, a partial sum or a "
                                  "copy of any reference value, although its operands are")
    return None


def source_of(inst: Instruction, repo_root: str) -> tuple[str | None, int | None]:
    """The innermost frame of `inst` inside the user's repository, as a repo-relative path."""
    root = Path(repo_root).resolve()
    for loc in inst.stack:
        try:
            path = Path(loc.file).resolve()
        except (OSError, ValueError):
            continue
        if "site-packages" in path.parts or path.name.startswith("<"):
            continue
        try:
            return path.relative_to(root).as_posix(), loc.line
        except ValueError:
            continue
    return None, None
