"""Work the reference does that the distributed program lacks (a norm, a residual add, a scale).

A distributed op whose operands are related to the reference, but whose value is not, may stand
for a reference op whose operands were computed further: each distributed operand is a slice of
a reference value (its *owner*) from which a short chain of reference ops leads to the reference
op's operand. The ops of the chain that compute something (not copies or re-layouts) are the
missing work. A chain never passes a slice (a value cut from the wrong place is a wrong window,
not missing work) nor a matmul (a layer, not a step).

The work belongs where the reference writes it: in the statement that consumes the value (a
final norm applied in the LM head's line: blame the distributed consumer) or in the one that made
it (a residual add in the MLP's return: blame the distributed producer), whichever shares more
of the chain's call stack.
"""

from __future__ import annotations

import dataclasses
import linecache
from collections import deque

from equivci.diagnose.frames import LAYOUT_OPS, innermost, user_frames
from equivci.hlo.ir import TRIVIAL_OPS, Instruction, Shape, SourceLoc
from equivci.translate.evaluator import Event

PASSIVE = TRIVIAL_OPS | LAYOUT_OPS
CUTTERS = {"slice", "dynamic-slice", "gather"}
# A chain stops at a matmul: contracting with a weight is a layer of its own, not a missing step.
STOPS = CUTTERS | {"dot", "convolution", "while", "all-to-all"}


@dataclasses.dataclass(frozen=True)
class MissingWork:
    """The reference op `consumer` computes operand `operand` from `owner` through `work`."""

    consumer: Event
    operand: int
    owner: Event
    work: tuple[Event, ...]  # the computing ops of the chain, in program order
    at_producer: bool  # the reference writes the work with the op that made the value
    tied: bool  # its statement is as close to the consumer's as to the producer's
    anchor: SourceLoc  # the reference statement that applies the work
    what: str  # the work in the reference's words: a function name or the ops


def shared_frames(a: list[SourceLoc], b: list[SourceLoc], by_function: bool = False) -> int:
    """How many frames two stacks share (the same line, or the same function), from the outermost."""
    n = 0
    for x, y in zip(reversed(a), reversed(b)):
        if (x.file, x.function if by_function else x.line) != (y.file, y.function if by_function else y.line):
            break
        n += 1
    return n


def source_text(loc: SourceLoc, limit: int = 90) -> str:
    text = linecache.getline(loc.file, loc.line).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MissingWorkFinder:
    """Searches the reference for the op a distributed op stands for, with work in between.

    `tracer` is the localizer's view of both programs (diagnose.localize._Tracer): values per
    device, operands by name, and the slice-of relation over the e-graph."""

    def __init__(self, tracer):
        self.tracer = tracer
        self.budgets = tracer.evaluator.budgets
        self.consumers: dict[str, list[Event]] = {}
        self.order: dict[str, int] = {}
        self.params: dict[int, Event] = {}
        self.inputs: dict[int, Event] = {}  # stand-ins for the inputs no event holds
        self.by_term: dict[int, Event] = {}
        self.operands_of: dict[str, tuple[str, ...]] = {}
        self.callers: dict[int, Event] = {}  # a called computation's value -> the call, which has its line
        for k, e in enumerate(tracer.reference_events):
            self.order[e.inst.name] = k
            v = tracer.value(e, 0)
            self.operands_of[e.inst.name] = self.resolved(e, v)
            for name in dict.fromkeys(self.operands_of[e.inst.name]):
                self.consumers.setdefault(name, []).append(e)
            if v is not None:
                if e.inst.opcode == "call":
                    self.callers.setdefault(id(v), e)
                self.by_term.setdefault(id(v), e)
                if v.op == "param":
                    self.params.setdefault(v.attrs[0], e)
        for e in tracer.reference_events:
            self.name_inputs(e, tracer.value(e, 0))

    def name_inputs(self, event: Event, value) -> None:
        """An input the reference reads directly (its parameter is no event) gets a stand-in event,
        named as the op's operand: chains of missing work start at inputs too (a norm the
        distributed program skips on the gathered input)."""
        if value is None or len(value.args) != len(event.inst.operands):
            return
        for name, arg in zip(event.inst.operands, value.args):
            if arg.op == "param" and arg.attrs[0] not in self.params and name not in self.tracer.ref_by_name:
                inst = Instruction(name, "parameter", Shape(arg.dtype, tuple(arg.shape)), (), {})
                self.inputs.setdefault(arg.attrs[0], Event(inst, [arg]))

    def resolved(self, event: Event, value) -> tuple[str, ...]:
        """The op's operands, where one no event holds (a parameter of a called computation: the
        select inside `jnp.where`'s call) named by the earlier op that holds the same term."""
        names = event.inst.operands
        if value is None or len(value.args) != len(names):
            return names
        out = []
        for name, arg in zip(names, value.args):
            held = self.by_term.get(id(arg)) if name not in self.tracer.ref_by_name else None
            out.append(held.inst.name if held is not None else name)
        return tuple(out)

    def owner(self, event: Event, dev: int) -> Event | None:
        """The latest reference op whose value the distributed `event` holds a slice of."""
        t = self.tracer.value(event, dev)
        if t is None:
            return None
        if id(t) in self.by_term:
            return self.by_term[id(t)]
        base = t
        while base.op == "slice":
            base = base.args[0]
        if base.op == "param" and base.attrs[0] in self.params:
            return self.params[base.attrs[0]]
        for e, v in reversed(self.tracer.ref_values[-self.budgets.missing_owner_checks :]):
            if self.tracer.is_slice_of(t, v):
                return e
        # Last, an input no reference op holds as it is: its own value (a window of it is cut by
        # a reference op too, and that op is the owner, found above).
        return self.inputs.get(base.attrs[0]) if base.op == "param" and base is t else None

    def input_read(self, event: Event, k: int, dev: int) -> Event | None:
        """The input `event` reads as its operand `k`, when that operand is the input itself."""
        value = self.tracer.value(event, dev)
        if value is None or len(value.args) != len(event.inst.operands) or value.args[k].op != "param":
            return None
        index = value.args[k].attrs[0]
        return self.params.get(index) or self.inputs.get(index)

    def reach(self, owner: Event) -> dict[str, str | None]:
        """Reference ops reachable forward from `owner` (without passing a slice) -> their parent."""
        parent: dict[str, str | None] = {owner.inst.name: None}
        depth = {owner.inst.name: 0}
        queue = deque([owner])
        while queue and len(parent) < self.budgets.missing_reached:
            e = queue.popleft()
            if depth[e.inst.name] >= self.budgets.missing_chain or (e is not owner and e.inst.opcode in STOPS):
                continue
            for c in self.consumers.get(e.inst.name, ()):
                if c.inst.name not in parent:
                    parent[c.inst.name] = e.inst.name
                    depth[c.inst.name] = depth[e.inst.name] + 1
                    queue.append(c)
        return parent

    def chain(self, parent: dict[str, str | None], end: str) -> list[Event]:
        """The ops from after the owner to `end`, in program order."""
        out = []
        step: str | None = end
        while step is not None and parent[step] is not None:
            out.append(self.tracer.ref_by_name[step])
            step = parent[step]
        return out[::-1]

    def find(self, event: Event, dev: int) -> MissingWork | None:
        # An operand without an event (a parameter of a called computation) constrains nothing,
        # unless its value is an input: the chain starts there.
        ops = self.tracer.operands(event)
        owners = [self.owner(o, dev) if o is not None else self.input_read(event, k, dev) for k, o in enumerate(ops)]
        if not any(owners) or any(w is None for o, w in zip(ops, owners) if o is not None):
            return None
        reached = [self.reach(w) if w is not None else None for w in owners]
        here = innermost(event.inst)
        best = None
        for name in set().union(*(r for r in reached if r is not None)):
            r = self.tracer.ref_by_name.get(name)
            if r is None or r.inst.opcode != event.inst.opcode or len(r.inst.operands) != len(ops):
                continue
            if not self.same_operand_types(ops, r):
                continue
            if any(reach is not None and rop not in reach for rop, reach in zip(self.operands_of[name], reached)):
                continue
            works = [
                [e for e in self.chain(reach, rop) if e.inst.opcode not in PASSIVE] if reach is not None else []
                for rop, reach in zip(self.operands_of[name], reached)
            ]
            k = next((k for k, w in enumerate(works) if w), None)
            if k is None or self.wrong_window(works[k], ops[k], owners[k], dev):
                continue
            key = (sum(map(len, works)), here is None or innermost(r.inst) != here, self.order[name])
            if best is None or key < best[0]:
                best = (key, r, k, works[k])
        if best is None:
            return None
        _, r, k, work = best
        r = r if innermost(r.inst) is not None else self.callers.get(id(self.tracer.value(r, 0)), r)
        owner = owners[k]
        return self.placed(r, k, owner, work) if owner is not None else None

    def same_operand_types(self, ops: list[Event | None], ref: Event) -> bool:
        """Each operand has the element type of the reference op's: an op that takes another type (a
        cast of integer positions where the reference casts angles) is not the op it stands for."""
        refs = [self.tracer.ref_by_name.get(name) for name in self.operands_of[ref.inst.name]]
        return all(o is None or r is None or o.inst.shape.dtype == r.inst.shape.dtype for o, r in zip(ops, refs))

    def wrong_window(self, work: list[Event], operand: Event | None, owner: Event | None, dev: int) -> bool:
        """The reference only cuts a window of `owner` here, and the distributed program cut one of
        it too (strided, reshaped, indexed): a window from the wrong place, not a missing cut."""
        if operand is None or owner is None or any(e.inst.opcode not in CUTTERS for e in work):
            return False
        ref = self.tracer.value(owner, 0)
        stack, seen = [operand], set[str]()
        while stack and len(seen) < self.budgets.missing_chain:
            e = stack.pop()
            if e.inst.name in seen or not self.tracer.is_slice_of(self.tracer.value(e, dev), ref):
                continue
            seen.add(e.inst.name)
            ops = self.tracer.operands(e)
            if (
                e.inst.opcode in CUTTERS
                and ops
                and ops[0] is not None
                and self.tracer.is_slice_of(self.tracer.value(ops[0], dev), ref)
            ):
                return True
            stack.extend(o for o in ops if o is not None)
        return False

    def placed(self, consumer: Event, k: int, owner: Event, work: list[Event]) -> MissingWork:
        """Where the reference writes the work: with its consumer or with the op that made the value.
        Where both share as much of its call stack (a statement of its own between them), the
        nearer of the two lines: a step written right after the statement that made its value is
        missing right after the distributed program's own."""
        frames = user_frames(work[0].inst)
        with_consumer = shared_frames(frames, user_frames(consumer.inst))
        with_producer = -1 if owner.inst.opcode == "parameter" else shared_frames(frames, user_frames(owner.inst))
        score = max(with_consumer, with_producer)
        tied = with_producer == with_consumer
        at_producer = with_producer > with_consumer or (tied and _nearer(frames, owner, consumer))
        if not frames:
            return MissingWork(consumer, k, owner, tuple(work), at_producer, tied, SourceLoc("", 0), _ops(work))
        # No statement shared, but a function (the norm is a statement of its own before the
        # consumer's): the work's line in that function.
        score = score or shared_frames(frames, user_frames(consumer.inst), by_function=True)
        at = max(len(frames) - score, 0) if score > 0 else 0
        anchor = frames[at]
        inner = frames[at - 1].function.split(".")[-1] if at > 0 and frames[at - 1].function else ""
        what = inner if inner and not inner.startswith("<") else _ops(work)
        return MissingWork(consumer, k, owner, tuple(work), at_producer, tied, anchor, what)


def _nearer(frames: list[SourceLoc], owner: Event, consumer: Event) -> bool:
    """The work's line is as near the line that made its value as the one that uses it, or nearer (same file)."""
    made, used = innermost(owner.inst), innermost(consumer.inst)
    if not frames or made is None or used is None or made[0] != frames[0].file or used[0] != frames[0].file:
        return False
    return abs(frames[0].line - made[1]) <= abs(used[1] - frames[0].line)


def _ops(work: list[Event]) -> str:
    names = list(dict.fromkeys(e.inst.opcode for e in work))
    shown = ", ".join(f"`{n}`" for n in names[:3])
    return shown + (", ..." if len(names) > 3 else "")
