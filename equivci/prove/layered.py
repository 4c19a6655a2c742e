"""Verify a model layer by layer, each distinct layer once.

Layers are proved in dependency order. Inside a layer, every value that enters it from another
layer is replaced by a leaf: a reference value by a fresh leaf of its own, a distributed value by
the window of the reference value it was proved to hold when its own layer was verified (that
relation is the contract between the two layers), and a distributed value with no such proof by a
fresh unknown leaf. Proving a layer for arbitrary leaves proves it for the actual values, so the
layer proofs compose into a proof of the model. Layers that are the same after this replacement
(the canonical form, see equivci.layers.canonical) share one proof: in the run, and through the
cache (kind "layers") across runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

from equivci import cache
from equivci.layers.canonical import CanonicalForm, canonical_form
from equivci.layers.segments import Layering, Segment, leaves, postorder, program_order
from equivci.prove.saturate import MAX_ITERATIONS, Proof, add_terms, proved_equal, saturate_terms
from equivci.terms.ir import Term
from equivci.translate.evaluator import Event
from equivci.translate.programs import Programs

# Leaves standing for values that enter a layer are params numbered from here (the model's own
# inputs are numbered from 0), so they can never be confused with an input.
LEAF_BASE = 1 << 40

Window = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class LayerOutcome:
    name: str | None
    proved: bool  # its obligations hold and each value it passes on is related to the reference
    reused: bool  # the proof of an identical layer (this run or the cache) was reused
    seconds: float
    exhausted: int = 0  # > 0: not proved, and its saturation stopped at this budget, not at a fixed point
    outgrown: tuple[int, int] = (0, 0)  # not proved, and its e-graph stopped at (rows, past this size budget)
    memory: int = 0  # > 0: what stopped it was its next pass's memory, predicted at this many bytes


@dataclasses.dataclass
class LayeredProof:
    proved: list[list[bool]]  # [device][output leaf]
    layers: list[LayerOutcome]

    @property
    def all_proved(self) -> bool:
        return all(all(row) for row in self.proved)


class _Abstraction:
    """One layer's terms with the values entering it replaced by leaves."""

    def __init__(
        self,
        programs: Programs,
        layering: Layering,
        name: str | None,
        relations: dict[Term, tuple[Term, Window]],
        entry_leaves: dict[Term, Term],
    ):
        self.evaluator = programs.evaluator
        self.layering = layering
        self.name = name
        self.relations = relations
        self.entry_leaves = entry_leaves
        self.map: dict[Term, Term] = {}

    def __call__(self, term: Term) -> Term:
        stack = [term]
        while stack:
            t = stack[-1]
            if t in self.map:
                stack.pop()
            elif self.layering.label.get(t) not in (self.name, None):  # unlabelled: a stated partner's own term
                self.map[t] = self._entering(t)
                stack.pop()
            elif pending := [a for a in t.args if a not in self.map]:
                stack.extend(pending)
            else:
                stack.pop()
                args = tuple(self.map[a] for a in t.args)
                same = all(x is y for x, y in zip(args, t.args))
                self.map[t] = t if same else self._rebuilt(t, args)
        return self.map[term]

    def _rebuilt(self, t: Term, args: tuple[Term, ...]) -> Term:
        """`t` over new arguments. Windows and concatenations are rebuilt in the translation's normal
        form (adjacent windows of one value are one window, a window of a concatenation is windows
        of its parts), as the translation built them where the operands were the model's inputs:
        the first layer's all-gather of its sharded input folded into that input there, and the next
        layers' all-gather of the windows standing for their entry values must fold the same way
        for their canonical forms to meet."""
        if t.op == "concat":
            return self.evaluator.concat(list(args), t.attrs[0])
        if t.op == "slice":
            dim, start, stop = t.attrs
            return self.evaluator.slice_term(args[0], dim, start, stop)
        return self.evaluator.table.make(t.op, t.attrs, args, t.shape, t.dtype)

    def stays_inside(self, term: Term) -> bool:
        """Whether `term` reads no value of another layer but those the layer's terms abstracted so
        far already read (a value of another layer is abstracted where it is met, so it is in the map)."""
        seen: set[Term] = set()
        stack = [term]
        while stack:
            t = stack.pop()
            if t in self.map or t in seen:
                continue
            if self.layering.label.get(t) not in (self.name, None):
                return False
            seen.add(t)
            stack.extend(t.args)
        return True

    def _entering(self, t: Term) -> Term:
        if t in self.layering.reference_terms or t not in self.relations:
            return self._leaf(t)
        reference, window = self.relations[t]
        return self.evaluator.slice_nd(self._leaf(reference), window)

    def _leaf(self, t: Term) -> Term:
        if t not in self.entry_leaves:
            index = LEAF_BASE + len(self.entry_leaves)
            self.entry_leaves[t] = self.evaluator.table.make("param", (index,), (), t.shape, t.dtype)
        return self.entry_leaves[t]


def prove_layers(
    programs: Programs, layering: Layering, memo: cache.Memo, progress=None, iterations: int = MAX_ITERATIONS
) -> LayeredProof:
    """Prove every layer of `layering` in order, each with a saturation budget of at least
    `iterations`; `progress(done, total)` after each."""
    relations: dict[Term, tuple[Term, Window]] = {}
    entry_leaves: dict[Term, Term] = {}
    proved = [[False] * len(row) for row in programs.device_outputs]
    reference_values = programs.reference_values()
    index = _ModelIndex(reference_values, programs.evaluator.equal_terms)
    outcomes = []
    for n, segment in enumerate(layering.segments):
        t0 = time.perf_counter()
        # First without the facts that reach into layers this one does not read (the residual
        # stream's sum of every earlier layer's outputs, stated in one order, differs from layer to
        # layer while what the layer computes does not): identical layers then share one proof.
        # Fewer facts prove less, never more; where they do not suffice, the layer with all of them.
        problem = _Problem.of(
            segment, programs, _Abstraction(programs, layering, segment.name, relations, entry_leaves), index, True
        )
        result, stored = _solve(problem, programs, memo, iterations)
        if problem.narrowed and not _holds(result):
            problem = _Problem.of(
                segment, programs, _Abstraction(programs, layering, segment.name, relations, entry_leaves), index
            )
            result, stored = _solve(problem, programs, memo, iterations)
        for (d, k), ok in zip(segment.obligations, result["proved"]):
            proved[d][k] = ok
        for t, relation in zip(segment.distributed_outputs, result["relations"]):
            if relation is not None:
                i, window = relation
                relations[t] = (segment.reference_outputs[i], tuple(map(tuple, window)))
        ok = _holds(result)
        exhausted = 0 if ok else result.get("exhausted", 0)
        outgrown = (0, 0) if ok else tuple(result.get("outgrown", (0, 0)))
        seconds = time.perf_counter() - t0
        memory = 0 if ok else result.get("memory", 0)
        outcomes.append(LayerOutcome(segment.name, ok, stored, seconds, exhausted, outgrown, memory))
        if progress is not None:
            progress(n + 1, len(layering.segments))
    return LayeredProof(proved, outcomes)


def _solve(problem: _Problem, programs: Programs, memo: cache.Memo, iterations: int) -> tuple[dict, bool]:
    """The result of `problem`, and whether it was the stored proof of an identical layer."""
    key = cache.key(
        cache.fingerprint(), "layer", problem.form.digest, str(iterations), repr(programs.evaluator.budgets)
    )
    stored = _valid(memo.get("layers", key), problem)
    result = stored or _prove(problem, programs, iterations)
    # A search the memory its next pass would take stopped is not stored: that depends on the memory
    # cap, which the key does not hold, and another run may have more of it.
    if stored is None and not result.get("memory"):
        memo.put("layers", key, result)
    return result, stored is not None


def _holds(result: dict) -> bool:
    """The layer's obligations hold and each value it passes on is related to the reference."""
    return all(result["proved"]) and all(r is not None for r in result["relations"])


class _ModelIndex:
    """The model's reference values and groups of equal terms, found from a layer's own terms.

    A layer scanning the whole model's lists (18k reference values at 405B shapes) costs time in
    proportion to the model, so the layers together cost time quadratic in their number."""

    def __init__(self, reference_values: list[Term], equal_terms: list[list[Term]]):
        self.reference_values = reference_values
        self.positions: dict[Term, list[int]] = {}
        for i, v in enumerate(reference_values):
            self.positions.setdefault(v, []).append(i)
        self.equal_terms = equal_terms  # appended to while terms are made: indexed as it grows
        self._groups_of: dict[Term, list[int]] = {}
        self._indexed = 0

    def reference_values_among(self, terms) -> list[Term]:
        """The reference values in `terms`, in order and with repeats, as in the model's list."""
        return [self.reference_values[i] for i in sorted(i for t in terms for i in self.positions.get(t, ()))]

    def groups_reached(self, abstraction: _Abstraction, inside: bool = False) -> tuple[list[list[Term]], bool]:
        """The groups with a member among the layer's terms, in the model's order, each with its
        other members brought into the layer (abstracted as the layer's own terms are; a partner
        that reaches into another layer meets that layer's values as leaves). The translator states
        a term's partners beside it (the written form of a transposed dot, the unsqueezed op, a
        reference builder's facts), often from terms nothing else in the layer uses: a group kept
        only when all its members are already there loses them. Partners bring their own groups,
        until none is new: only what the layer's terms reach joins its e-graph.
        `inside`: only the groups whose members read no value of another layer that the layer does
        not read itself (`_Abstraction.stays_inside`); also says whether a group was left out."""
        found: set[int] = set()
        left_out: set[int] = set()
        scanned = 0
        while True:
            self._index_new_groups()  # abstracting a partner can make terms, and state groups
            terms = list(abstraction.map)
            new = {j for t in terms[scanned:] for j in self._groups_of.get(t, ())} - found - left_out
            scanned = len(terms)
            if inside:
                kept = {j for j in new if all(abstraction.stays_inside(t) for t in self.equal_terms[j])}
                left_out |= new - kept
                new = kept
            if not new:
                return [[abstraction.map[t] for t in self.equal_terms[j]] for j in sorted(found)], bool(left_out)
            found |= new
            for j in sorted(new):
                for t in self.equal_terms[j]:
                    abstraction(t)

    def _index_new_groups(self) -> None:
        for j in range(self._indexed, len(self.equal_terms)):
            group = self.equal_terms[j]
            for t in group:
                self._groups_of.setdefault(t, []).append(j)
        self._indexed = len(self.equal_terms)


@dataclasses.dataclass
class _Problem:
    """A layer's proof obligations over its abstracted terms."""

    reference_outputs: list[Term]
    distributed_outputs: list[Term]
    pairs: list[tuple[Term, Term]]  # (device output, its target)
    marked: list[Term]  # reference values
    groups: list[list[Term]]  # terms known equal by evaluation
    form: CanonicalForm
    narrowed: bool = False  # some group the layer's terms reach was left out (`inside`)

    @classmethod
    def of(
        cls, segment: Segment, programs: Programs, abstraction: _Abstraction, index: _ModelIndex, inside: bool = False
    ):
        reference_outputs = [abstraction(t) for t in segment.reference_outputs]
        distributed_outputs = [abstraction(t) for t in segment.distributed_outputs]
        pairs = [
            (abstraction(programs.device_outputs[d][k]), abstraction(programs.targets[d][k]))
            for d, k in segment.obligations
        ]
        groups, narrowed = index.groups_reached(abstraction, inside)
        seen = abstraction.map
        marked = [seen[v] for v in index.reference_values_among(seen)]
        roots = reference_outputs + distributed_outputs + [t for pair in pairs for t in pair]
        # The partners are part of what the layer's proof may use: two layers share a proof only
        # when their partners are the same too.
        form = canonical_form(roots + [t for g in groups for t in g], marked, groups)
        return cls(reference_outputs, distributed_outputs, pairs, marked, groups, form, narrowed)


def _prove(problem: _Problem, programs: Programs, iterations: int) -> dict:
    proof = saturate_terms(
        problem.reference_outputs,
        problem.marked,
        [problem.pairs],
        problem.groups,
        problem.distributed_outputs,
        iterations=iterations,
        nodes=programs.evaluator.budgets.saturation_nodes,
    )
    relations: list = [None] * len(problem.distributed_outputs)

    def holds(a: Term, b: Term) -> bool:
        return proved_equal(proof.egraph, proof.loader.expr(a), proof.loader.expr(b))

    for j, t in enumerate(problem.distributed_outputs):
        i = next(
            (
                i
                for i, r in enumerate(problem.reference_outputs)
                if (r.shape, r.dtype) == (t.shape, t.dtype) and holds(t, r)
            ),
            None,
        )
        if i is not None:
            relations[j] = [i, [[0, s] for s in t.shape]]
    candidates = {}
    for j, t in enumerate(problem.distributed_outputs):
        if relations[j] is None:
            for i, r in enumerate(problem.reference_outputs):
                for window in _windows(t, r, programs.evaluator.budgets.layer_windows):
                    candidates[(j, i, window)] = programs.evaluator.slice_nd(r, window)
    add_terms(proof, list(candidates.values()))
    for (j, i, window), s in candidates.items():
        if relations[j] is None and holds(problem.distributed_outputs[j], s):
            relations[j] = [i, [list(w) for w in window]]
    outgrown = [proof.outgrown, proof.node_budget] if proof.outgrown else [0, 0]
    return {
        "proved": proof.proved[0],
        "relations": relations,
        "exhausted": proof.exhausted,
        "outgrown": outgrown,
        "memory": proof.memory,
    }


def _windows(t: Term, r: Term, most: int) -> list[Window]:
    """The windows of `r` with `t`'s shape on a grid of `t`-sized tiles (shards are tiles), if there are
    at most `most` (candidate windows tried per distributed and reference value pair)."""
    if t.dtype != r.dtype or len(t.shape) != len(r.shape) or t.shape == r.shape:
        return []
    if any(b % a for a, b in zip(t.shape, r.shape) if a):
        return []
    per_dim = [[(k * a, (k + 1) * a) for k in range(b // a)] if a else [(0, 0)] for a, b in zip(t.shape, r.shape)]
    count = 1
    for options in per_dim:
        count *= len(options)
    return list(itertools.product(*per_dim)) if count <= most else []


def _valid(payload, problem: _Problem) -> dict | None:
    """A stored layer result that fits this layer's shape (anything else is ignored and re-proved)."""
    if not isinstance(payload, dict):
        return None
    proved, relations = payload.get("proved"), payload.get("relations")
    if not (
        isinstance(proved, list) and len(proved) == len(problem.pairs) and all(isinstance(p, bool) for p in proved)
    ):
        return None
    if not (isinstance(relations, list) and len(relations) == len(problem.distributed_outputs)):
        return None
    if not isinstance(payload.get("exhausted", 0), int):
        return None
    outgrown = payload.get("outgrown", [0, 0])
    if not (isinstance(outgrown, list) and len(outgrown) == 2 and all(isinstance(n, int) for n in outgrown)):
        return None
    for relation, t in zip(relations, problem.distributed_outputs):
        if relation is None:
            continue
        try:
            i, window = relation
            ref = problem.reference_outputs[i]
            if [hi - lo for lo, hi in window] != list(t.shape) or len(window) != len(ref.shape):
                return None
        except (TypeError, ValueError, IndexError):
            return None
    return payload


@dataclasses.dataclass
class Prefix:
    """The layers up to the first unproved one, with the terms outside every layer: what the
    localization of a model too big to saturate whole works on, and all that it works on."""

    reference_values: list[Term]  # the model's inputs and the reference values inside
    distributed_values: list[Term]
    rows: list[list[tuple[Term, Term] | None]]  # [device][output leaf]: (output, target) inside, else None
    groups: list[list[Term]]  # the groups of terms stated equal that the terms inside reach
    reference_events: list[Event]  # the events with a value inside, in program order
    distributed_events: list[Event]


def prefix_of(programs: Programs, layering: Layering, outcomes: list[LayerOutcome]) -> Prefix:
    """The prefix of `programs` up to the first of `outcomes` not proved (the last when all are). Its
    terms outside every layer are those its layers use (the tables and constants of a later layer
    are not part of it), or all of them when the prefix reaches the obligations outside every layer."""
    first_bad = next((i for i, o in enumerate(outcomes) if not o.proved), len(outcomes) - 1)
    names = {s.name for s in layering.segments[: first_bad + 1]}
    label = layering.label
    events = programs.reference_events + programs.distributed_events
    used = set(program_order([v for e in events for dv in e.values for v in leaves(dv) if label.get(v) in names]))

    def inside(t: Term) -> bool:
        name = label.get(t)
        return name in names or (name is None and (None in names or t in used))

    def events_inside(events: list[Event]) -> list[Event]:
        return [e for e in events if any(inside(v) for dv in e.values for v in leaves(dv))]

    reference_values = (
        list(programs.params)
        + [v for e in programs.reference_events for v in leaves(e.values[0]) if inside(v)]
        + [v for v in programs.reference_inner if inside(v)]
    )
    distributed_values = [v for e in programs.distributed_events for dv in e.values for v in leaves(dv) if inside(v)]
    rows: list[list[tuple[Term, Term] | None]] = [
        [(o, t) if inside(o) and inside(t) else None for o, t in zip(row, targets)]
        for row, targets in zip(programs.device_outputs, programs.targets)
    ]
    roots = reference_values + distributed_values + [t for row in rows for p in row if p for t in p]
    return Prefix(
        reference_values,
        distributed_values,
        rows,
        groups_reaching(roots, programs.evaluator.equal_terms),
        events_inside(programs.reference_events),
        events_inside(programs.distributed_events),
    )


def groups_reaching(roots: list[Term], equal_terms: list[list[Term]]) -> list[list[Term]]:
    """The groups of `equal_terms` with a member among the terms under `roots`, in their order, and
    those their members' terms reach in turn (a layer's proof takes its groups the same way)."""
    groups_of: dict[Term, list[int]] = {}
    for j, group in enumerate(equal_terms):
        for t in group:
            groups_of.setdefault(t, []).append(j)
    seen: set[Term] = set()
    found: set[int] = set()
    pending = list(roots)
    while pending:
        reached: list[int] = []
        for t in postorder(pending, seen.__contains__):
            seen.add(t)
            reached.extend(j for j in groups_of.get(t, ()) if j not in found)
        found.update(reached)
        pending = [t for j in reached for t in equal_terms[j]]
    return [equal_terms[j] for j in sorted(found)]


def prefix_proof(prefix: Prefix, iterations: int = MAX_ITERATIONS, nodes: int | None = None) -> Proof:
    """The whole-program proof restricted to `prefix`. Obligations outside it stay unproved.
    `nodes`: the e-graph's size budget (Budgets.saturation_nodes; None derives it)."""
    proof = saturate_terms(
        prefix.reference_values,
        prefix.reference_values,
        [[p for p in row if p] for row in prefix.rows],
        prefix.groups,
        prefix.distributed_values,
        iterations=iterations,
        nodes=nodes,
    )
    proved = []
    for row, results in zip(prefix.rows, proof.proved):
        answers = iter(results)
        proved.append([next(answers) if p else False for p in row])
    return dataclasses.replace(proof, proved=proved)
