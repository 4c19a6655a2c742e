"""The diagnosis of a model too big to saturate whole: the proof up to its first unproved layer and
the first defect there, kept in the memo (kind "diagnoses") under everything they are computed from.

Both are computed from the prefix alone (equivci.prove.layered.Prefix: the layers up to the first
unproved one, the terms outside every layer that these use, the stated-equal groups all these reach,
the events with a value inside), so a change after the prefix (one layer further down, the LM head) finds them in the
memo, while a change inside it, to a source line its instructions name, to equivci (its rules are
among its sources), to a budget or to the saturation budget does not. A stored diagnosis always
names a defect: a prefix proof that proves every obligation, or a localization that finds nothing
inside the prefix (it then looks at the whole program, which depends on more), is never stored.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from equivci import cache
from equivci.diagnose.localize import Defect
from equivci.diagnose.loops import defect_with_loops
from equivci.diagnose.missing import MissingWork
from equivci.hlo.ir import Instruction, SourceLoc
from equivci.layers.canonical import canonical_form
from equivci.layers.segments import Layering, leaves
from equivci.prove.layered import LayerOutcome, Prefix, prefix_of, prefix_proof
from equivci.prove.saturate import Proof
from equivci.timings import Laps
from equivci.translate.evaluator import Event
from equivci.translate.programs import Programs

KIND = "diagnoses"


@dataclasses.dataclass
class Diagnosis:
    defect: Defect | None
    proof: Proof | None  # None when the diagnosis came from the memo
    exhausted: int  # > 0: the prefix proof stopped at this saturation budget, not at a fixed point
    iterations: int  # the saturation budget it was given
    outgrown: int = 0  # > 0: the prefix proof stopped past its size budget with this many rows
    node_budget: int = 0  # that size budget
    memory: int = 0  # > 0: it was the memory its next pass would take, predicted at this many bytes


def diagnose_prefix(
    programs: Programs,
    layering: Layering,
    outcomes: list[LayerOutcome],
    mesh: tuple[tuple[str, int], ...],
    iterations: int,
    memo: cache.Memo,
    laps: Laps,
) -> Diagnosis:
    prefix = prefix_of(programs, layering, outcomes)
    view = dataclasses.replace(
        programs, reference_events=prefix.reference_events, distributed_events=prefix.distributed_events
    )
    k = _key(prefix, programs, mesh, iterations)
    stored = memo.get(KIND, k) if k is not None else None
    restored = _restored(stored, view) if stored is not None else None
    if restored is not None:
        laps.lap("diagnosis up to the first unproved layer (from the memo)")
        return Diagnosis(restored[0], None, restored[1], iterations)
    proof = prefix_proof(prefix, iterations, programs.evaluator.budgets.saturation_nodes)
    laps.lap("prove up to the first unproved layer")
    if proof.all_proved:
        return Diagnosis(None, proof, proof.exhausted, iterations)
    found = defect_with_loops(view, proof, mesh)
    if found is None:  # nothing inside the prefix: look at the whole program, on the same e-graph
        found = defect_with_loops(programs, proof, mesh)
        laps.lap("localize")
        return Diagnosis(found, proof, proof.exhausted, iterations, proof.outgrown, proof.node_budget, proof.memory)
    laps.lap("localize")
    payload = _stored(found, view, proof.exhausted)
    # An e-graph stopped by its size budget is not stored: the memo restores no size note.
    if k is not None and payload is not None and not proof.outgrown:
        memo.put(KIND, k, payload)
    return Diagnosis(found, proof, proof.exhausted, iterations, proof.outgrown, proof.node_budget, proof.memory)


def _key(prefix: Prefix, programs: Programs, mesh, iterations: int) -> str | None:
    """The memo key of the prefix's diagnosis, or None where it depends on more than the prefix: a
    loop (its attempt is placed in the whole program) or a collective-permute (the localization
    re-runs the whole program with its pairs changed)."""
    if programs.loops or any(e.inst.opcode == "collective-permute" for e in prefix.distributed_events):
        return None
    events = prefix.reference_events + prefix.distributed_events
    values = [v for e in events for dv in e.values for v in leaves(dv)]
    roots = values + [t for row in prefix.rows for p in row if p for t in p] + [t for g in prefix.groups for t in g]
    terms = canonical_form(roots, prefix.reference_values, prefix.groups).digest
    routed = canonical_form(roots, [t for t in values if id(t) in programs.routed]).digest
    # Which of the events' values are the programs' outputs and targets (the localization asks).
    position: dict[int, int] = {}
    for i, v in enumerate(values):
        position.setdefault(id(v), i)
    ends = [
        [position.get(id(t), -1) for t in row]
        for row in [programs.reference_outputs, *programs.device_outputs, *programs.targets]
    ]
    rows = [[p is not None for p in row] for row in prefix.rows]
    lines: dict[str, set[int]] = {}
    for e in events:
        for loc in e.inst.stack:
            lines.setdefault(loc.file, set()).add(loc.line)
    return cache.key(
        cache.fingerprint(),
        KIND,
        terms,
        routed,
        repr((rows, ends, mesh, iterations, programs.evaluator.budgets)),
        str(len(prefix.reference_events)),
        *_inst_texts(prefix.reference_events),
        *_inst_texts(prefix.distributed_events),
        *(f"{file}:{_source_digest(file, lines[file])}" for file in sorted(lines)),
    )


# Attributes that name other computations (a reduction's function, a call's body): their ops are
# translated into the terms, their names are XLA's numbering.
_COMPUTATION_ATTRS = {
    "to_apply",
    "calls",
    "condition",
    "body",
    "branch_computations",
    "true_computation",
    "false_computation",
}


def _inst_texts(events: list[Event]) -> list[str]:
    """The instructions as the localization reads them, with XLA's names replaced by their order
    (an op added after the prefix renumbers the ops before it) and the metadata by what is read
    from it, `op_name` and `stack` (its stack frame number changes with other ops' frames). The
    localization reads `op_name` only for JAX's transformation wrappers (`transpose(`)."""
    order: dict[str, str] = {}
    for e in events:
        order.setdefault(e.inst.name, f"#{len(order)}")

    def renamed(name: str) -> str:
        return order.setdefault(name, f"?{len(order)}")  # an operand made outside the prefix

    texts = []
    for e in events:
        attrs = {
            k: ("<computation>" if k in _COMPUTATION_ATTRS else v) for k, v in e.inst.attrs.items() if k != "metadata"
        }
        operands = tuple(renamed(o) for o in e.inst.operands)
        name = order[e.inst.name]
        # Without a scope (`broadcast.14`: an op XLA made) it is one more of XLA's names.
        op_name = e.inst.op_name if "/" in e.inst.op_name or "(" in e.inst.op_name else "<unscoped>"
        texts.append(repr(dataclasses.replace(e.inst, name=name, op_name=op_name, operands=operands, attrs=attrs)))
    return texts


def _source_digest(file: str, lines: set[int]) -> str:
    """A digest of what the localization may read of `file` about `lines`: the top-level statements
    (a function with its decorators, a class, a module-level statement) that span them. The
    localization reads the statement at a line, the functions around it, their assignments and
    returns, all inside these; an edit elsewhere in the file (another layer's function) leaves it."""
    try:
        text = Path(file).read_text()
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError):
        return ""
    except (SyntaxError, ValueError):
        return hashlib.sha256(text.encode()).hexdigest()
    source = text.splitlines()
    spans = set()
    for line in lines:
        span = next(
            (
                (min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]), node.end_lineno)
                for node in tree.body
                if node.lineno <= line <= (node.end_lineno or node.lineno)
            ),
            None,
        )
        spans.add(span if span is not None else (line, 0))
    return cache.key(
        *(f"{start}-{end}\n" + ("\n".join(source[start - 1 : end]) if end else "") for start, end in sorted(spans))
    )


# --- a defect <-> JSON: instructions of the prefix's events by position (the findings find them by
# identity), any other (an instruction placed at another line) whole ------------------------------


def _stored(defect: Defect, view: Programs, exhausted: int) -> dict[str, Any] | None:
    try:
        return {"defect": _Writer(view).defect(defect), "exhausted": exhausted}
    except _Unstorable:
        return None


def _restored(payload: Any, view: Programs) -> tuple[Defect, int] | None:
    try:
        exhausted = payload["exhausted"]
        if not isinstance(exhausted, int):
            return None
        return _Reader(view).defect(payload["defect"]), exhausted
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None


class _Unstorable(Exception):
    """A defect that points at an event outside the prefix (never stored)."""


class _Writer:
    def __init__(self, view: Programs):
        self.events: dict[int, list] = {}
        self.insts: dict[int, list] = {}
        self.names: dict[str, list] = {}
        self.sides = {"reference": view.reference_events, "distributed": view.distributed_events}
        for side, events in self.sides.items():
            for i, e in enumerate(events):
                self.events.setdefault(id(e), [side, i])
                self.insts.setdefault(id(e.inst), [side, i])
                self.names.setdefault(e.inst.name, [side, i])

    def by_ref(self, ref: list) -> Instruction:
        side, i = ref
        return self.sides[side][i].inst

    def defect(self, d: Defect) -> dict[str, Any]:
        return {
            "inst": self.inst(d.inst),
            "message": d.message,
            "context": self.inst(d.context) if d.context is not None else None,
            "work": self.work(d.work) if d.work is not None else None,
            "frontier": self.inst(d.frontier) if d.frontier is not None else None,
            "constants": list(d.constants) if d.constants is not None else None,
            "alternative": [self.inst(d.alternative[0]), d.alternative[1]] if d.alternative is not None else None,
            "kept": d.kept,
            "axes": sorted(d.axes),
        }

    def inst(self, inst: Instruction) -> dict[str, Any]:
        """An event's instruction by the event's position, or one placed at another line (the same
        op, another stack) by the event's position and that stack; never by XLA's name."""
        if id(inst) in self.insts:
            return {"event": self.insts[id(inst)]}
        ref = self.names.get(inst.name)
        if ref is None or dataclasses.replace(self.by_ref(ref), stack=inst.stack) != inst:
            raise _Unstorable
        return {"event": ref, "stack": [_loc_json(loc) for loc in inst.stack]}

    def event(self, e: Event) -> list:
        if id(e) not in self.events:
            raise _Unstorable
        return self.events[id(e)]

    def work(self, w: MissingWork) -> dict[str, Any]:
        return {
            "consumer": self.event(w.consumer),
            "operand": w.operand,
            "owner": self.event(w.owner),
            "work": [self.event(e) for e in w.work],
            "at_producer": w.at_producer,
            "tied": w.tied,
            "anchor": _loc_json(w.anchor),
            "what": w.what,
        }


class _Reader:
    def __init__(self, view: Programs):
        self.sides = {"reference": view.reference_events, "distributed": view.distributed_events}

    def defect(self, d: dict[str, Any]) -> Defect:
        alternative = d["alternative"]
        constants = d["constants"]
        return Defect(
            self.inst(d["inst"]),
            str(d["message"]),
            context=self.inst(d["context"]) if d["context"] is not None else None,
            work=self.work(d["work"]) if d["work"] is not None else None,
            frontier=self.inst(d["frontier"]) if d["frontier"] is not None else None,
            constants=(float(constants[0]), float(constants[1])) if constants is not None else None,
            alternative=(self.inst(alternative[0]), str(alternative[1])) if alternative is not None else None,
            kept=bool(d["kept"]),
            axes=frozenset(str(a) for a in d["axes"]),
        )

    def event(self, ref: list) -> Event:
        side, i = ref
        return self.sides[side][i]

    def inst(self, d: dict[str, Any]) -> Instruction:
        inst = self.event(d["event"]).inst
        return dataclasses.replace(inst, stack=tuple(_loc_of(loc) for loc in d["stack"])) if "stack" in d else inst

    def work(self, w: dict[str, Any]) -> MissingWork:
        return MissingWork(
            self.event(w["consumer"]),
            int(w["operand"]),
            self.event(w["owner"]),
            tuple(self.event(e) for e in w["work"]),
            bool(w["at_producer"]),
            bool(w["tied"]),
            _loc_of(w["anchor"]),
            str(w["what"]),
        )


def _loc_json(loc: SourceLoc) -> list:
    return [loc.file, loc.line, loc.function]


def _loc_of(d: list) -> SourceLoc:
    file, line, function = d
    return SourceLoc(str(file), int(line), str(function))
