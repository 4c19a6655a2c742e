"""Loops (lax.scan, fori_loop) verified once, as invariants, instead of being opaque.

A distributed `while` is matched with a reference `while` and a *state relation*: every element
of the distributed loop state is, on every device, a window (possibly the whole) of one element
of the reference loop state, as inferred from the initial states. The loop is then proved by
induction over the iterations:

1. base: the initial states satisfy the relation (obligations for the enclosing proof, unless
   they hold by construction);
2. step: with the reference state taken as fresh unknowns S, the distributed state as the
   relation's windows of S, both bodies evaluated once (every device in lock step) must give
   states that satisfy the relation again, and both conditions must be the same predicate, so
   both loops run the same number of iterations.

The step is a program like any other (inputs S, outputs the new states and the condition) and is
proved by the same saturation. Only then does each distributed loop output become the
relation's window of the reference loop's output. A loop that no reference loop relates to, or
whose step is not proved, is unrolled when its trip count is a small constant
(equivci.translate.unroll: a microbatch accumulation, a pipeline schedule, a stage's layers
against all of the reference's), else stays opaque; a failed step proof is kept so that
localization (equivci.diagnose.loops) can point inside the body.
"""

from __future__ import annotations

import dataclasses

from equivci.hlo.ir import Instruction, Module
from equivci.prove.saturate import MAX_ITERATIONS, Proof, saturate
from equivci.terms.ir import Term
from equivci.translate.evaluator import Evaluator, Loop
from equivci.translate.programs import Programs
from equivci.translate.unroll import unroll

Window = tuple[tuple[int, int], ...]  # (start, stop) per dim


@dataclasses.dataclass(frozen=True)
class StateRelation:
    """A distributed state element as a window of one reference state element, per device."""

    ref_index: int
    windows: tuple[Window, ...]  # per device
    by_construction: bool  # the initial values are these windows (not just of the same shape)


@dataclasses.dataclass
class LoopAttempt:
    """What became of one distributed `while`."""

    inst: Instruction
    position: int  # number of distributed events evaluated before it
    init: list  # per device: the initial state
    reason: str | None = None  # why no step proof was attempted
    step: Programs | None = None
    proof: Proof | None = None
    unrolled: bool = False  # not proved by induction but evaluated iteration by iteration instead

    @property
    def failed_step(self) -> bool:
        """A step proof was tried and failed (whether or not the loop was then unrolled), or the loop
        stayed opaque: localization looks inside its body."""
        return not self.proved and (self.proof is not None or not self.unrolled)

    @property
    def proved(self) -> bool:
        return self.proof is not None and self.proof.all_proved


def window(term: Term) -> tuple[Term, Window]:
    """`term` as absolute (start, stop) ranges of the term under its outer slices."""
    slices = []
    while term.op == "slice":
        slices.append(term.attrs)
        term = term.args[0]
    ranges = [(0, n) for n in term.shape]
    for dim, start, stop in reversed(slices):  # innermost first: each slice is relative to the last
        base = ranges[dim][0]
        ranges[dim] = (base + start, base + stop)
    return term, tuple(ranges)


def window_within(value: Term, ref: Term) -> Window | None:
    """Where `value` lies inside `ref`, when both are windows of the same term."""
    base, outer = window(value)
    ref_base, ref_outer = window(ref)
    if base is not ref_base:
        return None
    inner = []
    for (a, b), (ra, rb) in zip(outer, ref_outer):
        if a < ra or b > rb:
            return None
        inner.append((a - ra, b - ra))
    return tuple(inner)


def infer_relations(ref_init: tuple[Term, ...], dist_init: list[tuple[Term, ...]]) -> list[StateRelation] | None:
    """A relation for every distributed state element, or None.

    Candidates, best first: a window of a reference element by construction (a slice of the same
    input); a reference element of the same shape, taken as equal; a block of a larger reference
    element, at the offsets of a slice inside the initial value or of another element's block
    of the same sizes (a zero-initialised buffer sharded like the weights). A candidate is only
    a guess: the base and step proofs decide whether it holds.
    """
    columns = [[dev[j] for dev in dist_init] for j in range(len(dist_init[0]))]
    constructed = [_windowed(ref_init, values) for values in columns]
    offsets = _block_offsets([r for found in constructed for r in found], ref_init)
    relations: list[StateRelation] = []
    for j, values in enumerate(columns):
        candidates = constructed[j] or _equal(ref_init, values) or _blocks(ref_init, values, offsets)
        if not candidates:
            return None
        used = {r.ref_index for r in relations}
        # Ties (two replicated stacks of one shape): an unused element, then the same position.
        relations.append(min(candidates, key=lambda r: (r.ref_index in used, r.ref_index != j, r.ref_index)))
    return relations


def _comparable(ref: Term, values: list[Term]) -> bool:
    return all(v.dtype == ref.dtype and len(v.shape) == len(ref.shape) for v in values)


def _windowed(ref_init: tuple[Term, ...], values: list[Term]) -> list[StateRelation]:
    found = []
    for k, ref in enumerate(ref_init):
        windows = [window_within(v, ref) for v in values] if _comparable(ref, values) else [None]
        known = [w for w in windows if w is not None]
        if len(known) == len(windows):
            found.append(StateRelation(k, tuple(known), True))
    return found


def _equal(ref_init: tuple[Term, ...], values: list[Term]) -> list[StateRelation]:
    return [
        StateRelation(k, tuple(_full(ref) for _ in values), False)
        for k, ref in enumerate(ref_init)
        if _comparable(ref, values) and all(v.shape == ref.shape for v in values)
    ]


def _full(term: Term) -> Window:
    return tuple((0, n) for n in term.shape)


def _block_offsets(
    relations: list[StateRelation], ref_init: tuple[Term, ...]
) -> dict[tuple[int, int], tuple[int, ...]]:
    """(reference size, block size) -> each device's block start, from windows known by construction."""
    offsets: dict[tuple[int, int], tuple[int, ...]] = {}
    for r in relations:
        for dim, size in enumerate(ref_init[r.ref_index].shape):
            starts = tuple(w[dim][0] for w in r.windows)
            width = r.windows[0][dim][1] - starts[0]
            if width < size and len(set(starts)) > 1:
                offsets.setdefault((size, width), starts)
    return offsets


def _blocks(
    ref_init: tuple[Term, ...], values: list[Term], offsets: dict[tuple[int, int], tuple[int, ...]]
) -> list[StateRelation]:
    found = []
    shape = values[0].shape
    for k, ref in enumerate(ref_init):
        if (
            not _comparable(ref, values)
            or any(v.shape != shape for v in values)
            or any(m > n for m, n in zip(shape, ref.shape))
            or shape == ref.shape
        ):
            continue
        per_dim = []
        for dim, (width, size) in enumerate(zip(shape, ref.shape)):
            starts = (
                (0,) * len(values)
                if width == size
                else _slice_starts(values, dim, size, width) or offsets.get((size, width))
            )
            per_dim.append(starts)
        known = [s for s in per_dim if s is not None]
        if len(known) == len(per_dim):
            windows = tuple(
                tuple((s[dev], s[dev] + width) for s, width in zip(known, shape)) for dev in range(len(values))
            )
            found.append(StateRelation(k, windows, False))
    return found


def _slice_starts(values: list[Term], dim: int, size: int, width: int, limit: int = 200) -> tuple[int, ...] | None:
    """Each device's start of the outermost slice inside its value that cuts `width` of `size` along `dim`."""
    starts = []
    for value in values:
        queue, start = [value], None
        seen: set[int] = set()
        while queue and len(seen) < limit and start is None:
            t = queue.pop(0)
            if id(t) in seen:
                continue
            seen.add(id(t))
            if (
                t.op == "slice"
                and t.attrs[0] == dim
                and t.attrs[2] - t.attrs[1] == width
                and t.args[0].shape[dim] == size
            ):
                start = t.attrs[1]
            queue.extend(t.args)
        if start is None:
            return None
        starts.append(start)
    return tuple(starts)


class LoopMatcher:
    """Evaluates the distributed program's `while` ops against the reference program's."""

    def __init__(self, reference: Module, reference_loops: list[Loop], iterations: int = MAX_ITERATIONS):
        self.reference = reference
        self.reference_loops = reference_loops
        self.iterations = iterations  # the saturation budget of each step proof
        self.attempts: list[LoopAttempt] = []
        self.unrolled = 0
        self._matched: set[int] = set()

    def evaluate(self, evaluator: Evaluator, inst: Instruction, init: list) -> list | None:
        attempt = LoopAttempt(inst, len(evaluator.events), init)
        self.attempts.append(attempt)
        if not _flat_state(inst, init):
            attempt.reason = "its state holds nested tuples"
            return None
        match = self._match(init)
        if match is None:
            attempt.reason = "no reference loop has a state that this loop's state is a window of, element by element"
            return self._unrolled(evaluator, attempt)
        ref_loop, relations = match
        attempt.step, attempt.proof = self._prove_step(evaluator, inst, ref_loop, relations)
        if not attempt.proved:  # (localization still looks inside the body whose step failed)
            return self._unrolled(evaluator, attempt)
        self._matched.add(id(ref_loop))
        for dev in range(evaluator.n):
            for rel, value in zip(relations, init[dev]):
                target = evaluator.slice_nd(ref_loop.init[0][rel.ref_index], rel.windows[dev])
                if value is not target:
                    evaluator.obligations.append((value, target))
        return [
            tuple(evaluator.slice_nd(ref_loop.out[0][rel.ref_index], rel.windows[dev]) for rel in relations)
            for dev in range(evaluator.n)
        ]

    def _unrolled(self, evaluator: Evaluator, attempt: LoopAttempt) -> list | None:
        """The loop evaluated iteration by iteration, when its trip count is a small constant."""
        out = unroll(evaluator, attempt.inst, attempt.init)
        attempt.unrolled = out is not None
        self.unrolled += attempt.unrolled
        return out

    def _match(self, init: list) -> tuple[Loop, list[StateRelation]] | None:
        """The reference loop whose state relates to `init`: not matched before if possible, then the
        one with the most elements related by construction, then the first."""
        best, best_key = None, None
        for order, ref_loop in enumerate(self.reference_loops):
            if not _flat_state(ref_loop.inst, ref_loop.init):
                continue
            relations = infer_relations(ref_loop.init[0], init)
            if relations is None:
                continue
            key = (id(ref_loop) in self._matched, -sum(r.by_construction for r in relations), order)
            if best_key is None or key < best_key:
                best, best_key = (ref_loop, relations), key
        return best

    def _prove_step(
        self, evaluator: Evaluator, inst: Instruction, ref_loop: Loop, relations: list[StateRelation]
    ) -> tuple[Programs, Proof]:
        n, table = evaluator.n, evaluator.table
        # The reference state at the top of an arbitrary iteration: unknowns, equal only to themselves.
        state = tuple(
            table.make("opaque", (f"loop state {ref_loop.inst.name}[{k}]",), (), t.shape, t.dtype)
            for k, t in enumerate(ref_loop.init[0])
        )
        ref = evaluator.child(self.reference, 1)
        ref_next = ref.run(_called(self.reference, ref_loop.inst, "body"), [[state]])[0]
        ref_cond = ref.run(_called(self.reference, ref_loop.inst, "condition"), [[state]])[0]

        dist = evaluator.child(evaluator.module, n)
        inner = LoopMatcher(self.reference, ref.loops, self.iterations)
        dist.loop_handler = inner
        dist_state = [tuple(dist.slice_nd(state[r.ref_index], r.windows[dev]) for r in relations) for dev in range(n)]
        dist_next = dist.run(_called(evaluator.module, inst, "body"), [dist_state])
        dist_cond = dist.run(_called(evaluator.module, inst, "condition"), [dist_state])

        targets = [
            [dist.slice_nd(ref_next[r.ref_index], r.windows[dev]) for r in relations] + [ref_cond] for dev in range(n)
        ]
        outputs = [list(dist_next[dev]) + [dist_cond[dev]] for dev in range(n)]
        step = Programs(
            list(state),
            list(ref_next) + [ref_cond],
            outputs,
            targets,
            ref.events,
            dist.events,
            dist,
            obligations=dist.obligations,
            loops=inner.attempts,
        )
        return step, saturate(step, iterations=self.iterations)


def _called(module: Module, inst: Instruction, key: str):
    return module.computations[inst.attrs[key].lstrip("%")]


def _flat_state(inst: Instruction, init: list) -> bool:
    """A tuple of arrays, held as a tuple of terms on every device."""
    return (
        inst.shape.is_tuple
        and not any(e.is_tuple for e in inst.shape.elements)
        and all(isinstance(v, tuple) and all(isinstance(t, Term) for t in v) for v in init)
    )
