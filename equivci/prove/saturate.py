"""Equality saturation over both programs: are the distributed outputs the reference outputs?"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from egglog import EGraph, eq, union

from equivci.options import SATURATION_ITERATIONS, SATURATION_NODES
from equivci.prove import memory
from equivci.terms import language as L
from equivci.terms.ir import Term
from equivci.terms.load import Loader
from equivci.terms.rules import DIMS, RELATIONS, REWRITES, SEEDS
from equivci.translate.programs import Programs

# The saturation budget: at least this many iterations (EQUIVCI_SATURATION_ITERATIONS sets it), and
# at least the depth of the terms, since a fact about an op can need one iteration per op below it.
MAX_ITERATIONS = SATURATION_ITERATIONS

# The size budget: no saturation pass starts on an e-graph of more rows than GROWTH times the rows its
# terms loaded, nor than SATURATION_NODES (EQUIVCI_SATURATION_NODES sets one budget for every
# saturation instead). A rule that keeps making new terms grows the e-graph geometrically, 2.5x a
# pass (measured: 600 rows to 9.5M rows and 3.3 GB in 15 passes), long before the iteration budget
# ends the search; the proofs of tests/prove and tests/soundness grow less than 4x.
GROWTH = 1000


def node_budget(loaded: int, setting: int | None) -> int:
    """The rows an e-graph may reach whose terms loaded `loaded` rows (`setting`: the user's budget)."""
    return setting if setting is not None else min(SATURATION_NODES, GROWTH * loaded)


@dataclasses.dataclass
class Proof:
    proved: list[list[bool]]  # [device][leaf]
    egraph: EGraph
    loader: Loader
    seconds: float
    obligations: list[bool] = dataclasses.field(default_factory=list)
    targets: list[list[Term]] = dataclasses.field(default_factory=list)  # [device][leaf], as in Programs
    iterations: int = MAX_ITERATIONS  # the budget asked for (each run allows at least the terms' depth)
    exhausted: int = 0  # > 0: a run used this many iterations and the rules could still change the e-graph
    nodes: int | None = None  # the size budget set by the user (Budgets.saturation_nodes); None: derived
    loaded: int = 0  # the e-graph's rows that loading the terms made (the hints and hypotheses added too)
    outgrown: int = 0  # > 0: a run stopped at the size budget with this many rows in the e-graph
    memory: int = 0  # > 0: what stopped it was its next pass's memory, predicted at this many bytes
    # > 0: localization hypotheses grew the e-graph past their own budget (add_hypotheses) to this
    # many rows; later ones are loaded without a pass. No stop of the proof's own search: no note.
    runaway: int = 0
    hinted: int = 0  # > 0: its last run was with this many proposed windows, within their own budget

    @property
    def all_proved(self) -> bool:
        return all(all(row) for row in self.proved) and all(self.obligations)

    @property
    def node_budget(self) -> int:
        return node_budget(self.loaded, self.nodes)


def saturate(programs: Programs, iterations: int = MAX_ITERATIONS) -> Proof:
    """First with the stated equalities the outputs can use only; unless that proves them, the
    others join that e-graph, which saturates on within the same budgets (the localization reads
    every value's relation there). A fresh search with all of them repeated the first one, as large
    again where the size budget had stopped it (split 15's Grok dispatch: 12 s, then 17 s CPU)."""
    reference_values = programs.reference_values()
    groups = programs.evaluator.equal_terms
    pairs = _pairs(programs)
    roots = [*reference_values, *programs.reference_outputs, *_members(pairs), *_members([programs.obligations])]
    needed = needed_groups(groups, roots)
    proof = saturate_terms(
        programs.reference_outputs,
        reference_values,
        pairs,
        needed,
        obligations=programs.obligations,
        iterations=iterations,
        nodes=programs.evaluator.budgets.saturation_nodes,
        until_proved=True,
    )
    if proof.all_proved or len(needed) == len(groups):
        return proof
    kept = {id(group) for group in needed}
    t0 = time.perf_counter()
    add_terms(proof, [], [group for group in groups if id(group) not in kept])
    proof.seconds += time.perf_counter() - t0
    return _checked(proof, programs)


def needed_groups(groups: list[list[Term]], roots: list[Term]) -> list[list[Term]]:
    """The groups of terms stated equal that share a term with the roots or their arguments, or with
    another such group (in turn), or whose member is an op on an opaque value reached so (a device's
    running sum plus the earlier total, which the program adds in another order: no rule relates
    an op without a model, only the stated facts do). The others are about values no output and no reference value
    is made of: a pipeline's warm-up ticks computing on zeros, whose values no tick writes out.
    Such values are constant along the microbatch rows (a bias broadcast through GELU), so they
    are windows of each other at every row offset, and their facts grew the e-graph past its budget
    before the outputs' own facts were reached (split 14 pp-tp-gpipe-fori: 4M rows, unproven; its
    outputs proved in a second without them). Leaving facts out never proves more."""
    by_term: dict[Term, list[int]] = {}
    for k, group in enumerate(groups):
        for t in group:
            by_term.setdefault(t, []).append(k)
            for arg in set(t.args):
                if arg.op == "opaque":  # only stated facts relate an op without a model (a running sum)
                    by_term.setdefault(arg, []).append(k)
    reached: set[Term] = set()
    kept = [False] * len(groups)
    stack = list(roots)
    while stack:
        t = stack.pop()
        if t in reached:
            continue
        reached.add(t)
        stack.extend(t.args)
        for k in by_term.get(t, ()):
            if not kept[k]:
                kept[k] = True
                stack.extend(groups[k])
    return [group for group, keep in zip(groups, kept) if keep]


def _members(pairs: list[list[tuple[Term, Term]]]) -> list[Term]:
    return [t for row in pairs for pair in row for t in pair]


def with_hints(proof: Proof, programs: Programs, hints: list[Term], iterations: int) -> Proof:
    """`proof` of `programs` with the terms `hints` loaded into its e-graph and saturated again within
    `iterations` (at least the terms' depth). The e-graph grows from the one saturated already: every
    fact of a fresh saturation of all the terms is reached in as many iterations, the old ones free."""
    t0 = time.perf_counter()
    proof.iterations, proof.exhausted, proof.hinted = iterations, 0, len(hints)
    add_terms(proof, hints)
    proof.seconds += time.perf_counter() - t0
    return _checked(proof, programs)


def _checked(proof: Proof, programs: Programs) -> Proof:
    """`proof` with its outputs and obligations checked again on its e-graph."""
    proof.proved = [
        [proved_equal(proof.egraph, proof.loader.expr(o), proof.loader.expr(t)) for o, t in row]
        for row in _pairs(programs)
    ]
    proof.obligations = [
        proved_equal(proof.egraph, proof.loader.expr(a), proof.loader.expr(b)) for a, b in programs.obligations
    ]
    return proof


def _pairs(programs: Programs) -> list[list[tuple[Term, Term]]]:
    return [list(zip(dev_out, dev_targets)) for dev_out, dev_targets in zip(programs.device_outputs, programs.targets)]


def saturate_terms(
    reference_outputs: list[Term],
    reference_values: list[Term],
    pairs: list[list[tuple[Term, Term]]],
    equal_groups: list[list[Term]],
    extra_terms: Sequence[Term] = (),
    obligations: Sequence[tuple[Term, Term]] = (),
    iterations: int = MAX_ITERATIONS,
    nodes: int | None = None,
    until_proved: bool = False,
) -> Proof:
    """Saturate the terms of both programs; `pairs[d]` are (distributed output, target) to prove
    equal, `reference_values` the terms that are values of the reference program, `obligations`
    more (term, target) pairs the proof needs (the initial states loops assumed). `nodes`: the size
    budget (node_budget), None to derive it from the rows the terms load. `until_proved`: stop after
    the pass that proves every pair and obligation (a whole-program proof whose e-graph nothing
    else reads once it holds; a layer's proof is read for its other values' relations too)."""
    t0 = time.perf_counter()
    egraph = EGraph()
    loader = Loader(egraph)
    with loader.bulk():
        for t in reference_outputs:
            loader.expr(t)
        facts: list = []
        for t in reference_values:
            facts += [L.related(loader.expr(t)), L.reference(loader.expr(t))]
        for row in pairs:
            for o, target in row:
                loader.expr(o)
                loader.expr(target)
        for pair in obligations:
            for t in pair:
                loader.expr(t)
        for t in extra_terms:
            loader.expr(t)
        for group in equal_groups:
            first = loader.expr(group[0])
            facts += [union(first).with_(loader.expr(t)) for t in group[1:]]
        loader.facts += facts
    loaded = size(egraph)

    def every_pair_proved() -> bool:
        checked = [pair for row in pairs for pair in row] + list(obligations)
        return all(proved_equal(egraph, loader.expr(a), loader.expr(b)) for a, b in checked)

    end = _run(
        egraph, max(iterations, loader.depth), node_budget(loaded, nodes), every_pair_proved if until_proved else None
    )
    proved = [[proved_equal(egraph, loader.expr(o), loader.expr(target)) for o, target in row] for row in pairs]
    held = [proved_equal(egraph, loader.expr(a), loader.expr(b)) for a, b in obligations]
    targets = [[target for _, target in row] for row in pairs]
    seconds = time.perf_counter() - t0
    proof = Proof(proved, egraph, loader, seconds, held, targets, iterations, end.exhausted, nodes, loaded)
    proof.outgrown, proof.memory = end.outgrown, end.memory
    return proof


def size(egraph: EGraph) -> int:
    """The rows of all the e-graph's tables (e-nodes, analyses, relations): what its memory grows with."""
    return sum(n for _, n in egraph.all_function_sizes())


class RunEnd(NamedTuple):
    """How a run ended: `exhausted` is its iteration budget when one more pass still changed the
    e-graph (the budget, not the rules, ended the search), else 0; `outgrown` the e-graph's rows when
    its size ended it, else 0; `memory` > 0 when that size was the memory its next pass was predicted
    to take (these bytes, past memory.SHARE of the memory cap), not its rows."""

    exhausted: int
    outgrown: int
    memory: int = 0


def _run(
    egraph: EGraph, iterations: int, nodes: int = SATURATION_NODES, done: Callable[[], bool] | None = None
) -> RunEnd:
    """Saturate for at most `iterations` passes, none of them started on an e-graph that would reach
    `nodes` rows if it grew by the factor of the pass before, nor one predicted to take more memory
    than the process may use (memory.py); and none after a pass at whose end `done()` holds (every
    pair a proof compares is proved: further passes can only add equalities, never remove one)."""
    # The seeds record what the rules start from, before them: a rule reads in the pass that made its seed.
    step = DIMS.ruleset.saturate() + RELATIONS.ruleset.saturate() + SEEDS + REWRITES
    exhausted, outgrown, over = iterations, 0, 0
    limit, meter, predicted = memory.cap(), memory.PassMeter(), None
    # One pass at a time, so that the size is read between passes; the last one only asks whether
    # the rules could still change the e-graph. A pass is not started where it would end past the
    # budget if it grew the e-graph as much as the pass before it: a growing e-graph grows faster
    # pass by pass (2.7x, then 8x, then 5x on one program), and a pass started just under the budget
    # took it from 2.9M rows past 17 GB. Its rows do not bound the memory a pass takes to match the
    # rules, which grows with their square: that is measured and bounded on its own.
    growth = 1.0
    for _ in range(iterations + 1):
        rows = size(egraph)
        if rows * growth >= nodes or not memory.fits(predicted, limit):
            exhausted, outgrown = 0, rows
            over = 0 if memory.fits(predicted, limit) else predicted or 0
            break
        meter.begin()
        if not egraph.run(step).updated:
            exhausted = 0
            break
        growth = max(1.0, size(egraph) / rows)
        predicted = memory.next_pass(meter.extra(), growth)
        if done is not None and done():
            exhausted = 0
            break
    egraph.run(DIMS.ruleset.saturate() + RELATIONS.ruleset.saturate())
    return RunEnd(exhausted, outgrown, over)


def add_terms(
    proof: Proof,
    terms: list[Term],
    equal_groups: Sequence[list[Term]] = (),
    passes: int | None = None,
    growth: int | None = None,
) -> None:
    """Load more terms (hypotheses for localization) and saturate again, within the proof's budget.
    `equal_groups`: terms the translator stated equal while building them (true identities);
    `passes`: at most this many passes instead of the proof's iteration budget; `growth`: the run
    may add at most this many times the rows the terms loaded (else the proof's size budget alone)."""
    new = [t for t in terms if t not in proof.loader.exprs]
    if not new and not equal_groups:
        return
    before = size(proof.egraph)
    with proof.loader.bulk():
        for t in new:
            proof.loader.expr(t)
        for group in equal_groups:
            first = proof.loader.expr(group[0])
            proof.loader.facts += [union(first).with_(proof.loader.expr(t)) for t in group[1:]]
    rows = size(proof.egraph)
    proof.loaded += rows - before
    if proof.outgrown or proof.runaway:
        # The budget grows with the rows loaded (node_budget): without this, each hypothesis would
        # let an e-graph that reached its budget run one more pass, each of them its biggest yet.
        proof.outgrown = rows if proof.outgrown else 0
        return
    iterations = max(proof.iterations, proof.loader.depth) if passes is None else passes
    own = None if growth is None else rows + growth * (rows - before)
    end = _run(proof.egraph, iterations, proof.node_budget if own is None else min(own, proof.node_budget))
    proof.exhausted, proof.memory = max(proof.exhausted, end.exhausted), max(proof.memory, end.memory)
    if own is not None and end.outgrown and not end.memory and own < proof.node_budget:
        proof.runaway = end.outgrown
    else:
        proof.outgrown = max(proof.outgrown, end.outgrown)


# The passes a localization hypothesis gets on an e-graph whose own search the iteration budget
# ended: its rules never settled, so each hypothesis would run the whole budget again on a graph
# still growing (a pipeline's bubble ticks make dozens of unrelated values, each asking whether its
# sum over an axis is related: minutes each). The hypothesis is one op on loaded terms, whose
# facts the budget searched already: a few passes relate it, as on a settled e-graph.
HYPOTHESIS_PASSES = 8


def add_hypotheses(proof: Proof, terms: list[Term]) -> None:
    """`terms` loaded for localization (never a verdict): saturated again within the proof's budget
    on an e-graph whose rules settled, within HYPOTHESIS_PASSES on one they did not, and adding at
    most GROWTH times the rows they load, as a proof may grow from its terms: a hypothesis is a few
    ops whose facts are few. One that sets the rules growing without end (split 17's pipeline: from
    8.6k rows, x1.97 a pass, to 0.9M rows and 5.5 GB in 16 passes) stops there, and the hypotheses
    after it are loaded without a pass, as on an e-graph past its budget."""
    add_terms(proof, terms, passes=HYPOTHESIS_PASSES if proof.exhausted else None, growth=GROWTH)


def is_related(proof: Proof, term: Term, constants: dict) -> bool:
    if term in constants:
        return True
    if term not in proof.loader.exprs:
        return False
    try:
        proof.egraph.check(L.related(proof.loader.expr(term)))
        return True
    except Exception:  # egglog reports a failed check as an error
        return False


def proved_equal(egraph: EGraph, a, b) -> bool:
    try:
        egraph.check(eq(a).to(b))
        return True
    except Exception:  # egglog reports a failed check as an error
        return False
