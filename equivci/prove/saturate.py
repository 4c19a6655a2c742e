"""Equality saturation over both programs: are the distributed outputs the reference outputs?"""

from __future__ import annotations

import dataclasses
import time

from egglog import EGraph, eq, union

from equivci.capture.types import LeafPlacement
from equivci.hlo.ir import Module
from equivci.terms import language as L
from equivci.translate.evaluator import Evaluator, Event
from equivci.terms.load import Loader
from equivci.translate.routing import Router
from equivci.terms.ir import Term, TermTable

MAX_ITERATIONS = 120


@dataclasses.dataclass
class Programs:
    """Both programs as terms over the reference inputs."""

    params: list[Term]  # the reference inputs
    reference_outputs: list[Term]
    device_outputs: list[list[Term]]  # [device][leaf]
    targets: list[list[Term]]  # [device][leaf]: the slice of the reference output the device must hold
    reference_events: list[Event]
    distributed_events: list[Event]
    evaluator: Evaluator
    routed: set[int] = dataclasses.field(default_factory=set)  # ids of dispatch masks and routed values
    # (term, target) pairs that must be proved equal too: the state relations loops assumed.
    obligations: list[tuple[Term, Term]] = dataclasses.field(default_factory=list)
    loops: list = dataclasses.field(default_factory=list)  # loops.LoopAttempt, in program order
    # input index -> (its assumed [lo, hi], the reference gather that makes it an index and the calls it is in)
    assumed: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Proof:
    proved: list[list[bool]]  # [device][leaf]
    egraph: EGraph
    loader: Loader
    seconds: float
    obligations: list[bool] = dataclasses.field(default_factory=list)
    targets: list[list[Term]] = dataclasses.field(default_factory=list)  # [device][leaf], as in Programs

    @property
    def all_proved(self) -> bool:
        return all(all(row) for row in self.proved) and all(self.obligations)


def flatten(value) -> list[Term]:
    """The leaves of a (nested) tuple of terms."""
    return [leaf for item in value for leaf in flatten(item)] if isinstance(value, tuple) else [value]


def build_programs(reference: Module, distributed: Module, inputs: tuple[LeafPlacement, ...],
                   outputs: tuple[LeafPlacement, ...], num_devices: int) -> Programs:
    table = TermTable()
    params = [table.make("param", (k,), (), leaf.shape, _short_dtype(leaf.dtype)) for k, leaf in enumerate(inputs)]

    ref_eval = Evaluator(reference, table, 1)
    ref_root = ref_eval.run(reference.entry, [[p] for p in params])[0]
    # Integer inputs the reference uses as indices are taken to be valid indices, [0, size): the
    # programs are compared on the inputs the reference is written for (the numeric oracle draws
    # them there too). Known before evaluation, the bounds fold the reference's own range checks.
    domains = ref_eval.index_domains()
    bounds = {p: b for p, (b, _) in domains.items()}
    if domains:
        ref_eval = Evaluator(reference, table, 1)
        ref_eval.bounds.update(bounds)
        ref_root = ref_eval.run(reference.entry, [[p] for p in params])[0]
    reference_outputs = flatten(ref_root)

    dist_eval = Evaluator(distributed, table, num_devices)
    dist_eval.bounds.update(bounds)
    dist_eval.values.update(ref_eval.values)
    dist_eval.arrays.extend(ref_eval.arrays)
    # loops proves loop bodies with `saturate`: imported here, where both modules are complete.
    from equivci.prove.loops import LoopMatcher
    matcher = LoopMatcher(reference, ref_eval.loops)
    dist_eval.loop_handler = matcher
    dist_args = [[dist_eval.slice_nd(p, leaf.device_slices[dev]) for dev in range(num_devices)]
                 for p, leaf in zip(params, inputs)]
    dist_root = dist_eval.run(distributed.entry, dist_args)
    device_outputs = [flatten(dist_root[dev]) for dev in range(num_devices)]
    targets = [[dist_eval.slice_nd(r, leaf.device_slices[dev]) for r, leaf in zip(reference_outputs, outputs)]
               for dev in range(num_devices)]
    router = Router(dist_eval, num_devices)
    router.run(dist_eval.events)
    dist_eval.equal_terms.extend([a, b] for a, b in router.facts)
    return Programs(params, reference_outputs, device_outputs, targets, ref_eval.events, dist_eval.events, dist_eval,
                    router.exempt, dist_eval.obligations, matcher.attempts,
                    {p.attrs[0]: domain for p, domain in domains.items()})


def _short_dtype(dtype: str) -> str:
    return {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16", "int32": "s32",
            "int64": "s64", "uint32": "u32", "uint8": "u8", "int8": "s8", "bool": "pred"}.get(dtype, dtype)


def saturate(programs: Programs, extra_terms: list[Term] = (), iterations: int = MAX_ITERATIONS) -> Proof:
    reference_values = list(programs.params)
    for event in programs.reference_events:
        reference_values.extend(flatten(event.values[0]))
    pairs = [list(zip(dev_out, dev_targets)) for dev_out, dev_targets in zip(programs.device_outputs, programs.targets)]
    return saturate_terms(programs.reference_outputs, reference_values, pairs, programs.evaluator.equal_terms,
                          extra_terms, programs.obligations, iterations)


def saturate_terms(reference_outputs: list[Term], reference_values: list[Term], pairs: list[list[tuple[Term, Term]]],
                   equal_groups: list[list[Term]], extra_terms: list[Term] = (),
                   obligations: list[tuple[Term, Term]] = (), iterations: int = MAX_ITERATIONS) -> Proof:
    """Saturate the terms of both programs; `pairs[d]` are (distributed output, target) to prove
    equal, `reference_values` the terms that are values of the reference program, `obligations`
    more (term, target) pairs the proof needs (the initial states loops assumed)."""
    t0 = time.perf_counter()
    egraph = EGraph()
    loader = Loader(egraph)
    with loader.bulk():
        for t in reference_outputs:
            loader.expr(t)
        facts = []
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
    _run(egraph, iterations)
    proved = [[proved_equal(egraph, loader.expr(o), loader.expr(target)) for o, target in row] for row in pairs]
    held = [proved_equal(egraph, loader.expr(a), loader.expr(b)) for a, b in obligations]
    targets = [[target for _, target in row] for row in pairs]
    return Proof(proved, egraph, loader, time.perf_counter() - t0, held, targets)


def _run(egraph: EGraph, iterations: int) -> None:
    egraph.run((L.dims.saturate() + L.relations.saturate() + L.REWRITES) * iterations)
    egraph.run(L.dims.saturate() + L.relations.saturate())


def add_terms(proof: Proof, terms: list[Term], iterations: int = MAX_ITERATIONS) -> None:
    """Load more terms (hypotheses for localization) and saturate again."""
    new = [t for t in terms if t not in proof.loader.exprs]
    if not new:
        return
    with proof.loader.bulk():
        for t in new:
            proof.loader.expr(t)
    _run(proof.egraph, iterations)


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
