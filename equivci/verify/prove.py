"""Equality saturation over both programs: are the distributed outputs the reference outputs?"""

from __future__ import annotations

import dataclasses
import time

from egglog import EGraph, eq, union

from equivci.capture.types import LeafPlacement
from equivci.hlo.ir import Module
from equivci.verify import language as L
from equivci.verify.instantiate import Evaluator, Event
from equivci.verify.load import Loader
from equivci.verify.terms import Term, TermTable

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


@dataclasses.dataclass
class Proof:
    proved: list[list[bool]]  # [device][leaf]
    egraph: EGraph
    loader: Loader
    seconds: float
    targets: list[list[Term]] = dataclasses.field(default_factory=list)  # [device][leaf], as in Programs

    @property
    def all_proved(self) -> bool:
        return all(all(row) for row in self.proved)


def flatten(value) -> list[Term]:
    """The leaves of a (nested) tuple of terms."""
    return [leaf for item in value for leaf in flatten(item)] if isinstance(value, tuple) else [value]


def build_programs(reference: Module, distributed: Module, inputs: tuple[LeafPlacement, ...],
                   outputs: tuple[LeafPlacement, ...], num_devices: int) -> Programs:
    table = TermTable()
    params = [table.make("param", (k,), (), leaf.shape, _short_dtype(leaf.dtype)) for k, leaf in enumerate(inputs)]

    ref_eval = Evaluator(reference, table, 1)
    ref_root = ref_eval.run(reference.entry, [[p] for p in params])[0]
    reference_outputs = flatten(ref_root)

    dist_eval = Evaluator(distributed, table, num_devices)
    dist_eval.values.update(ref_eval.values)
    dist_eval.arrays.extend(ref_eval.arrays)
    dist_args = [[dist_eval.slice_nd(p, leaf.device_slices[dev]) for dev in range(num_devices)]
                 for p, leaf in zip(params, inputs)]
    dist_root = dist_eval.run(distributed.entry, dist_args)
    device_outputs = [flatten(dist_root[dev]) for dev in range(num_devices)]
    targets = [[dist_eval.slice_nd(r, leaf.device_slices[dev]) for r, leaf in zip(reference_outputs, outputs)]
               for dev in range(num_devices)]
    return Programs(params, reference_outputs, device_outputs, targets, ref_eval.events, dist_eval.events, dist_eval)


def _short_dtype(dtype: str) -> str:
    return {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16", "int32": "s32",
            "int64": "s64", "uint32": "u32", "uint8": "u8", "int8": "s8", "bool": "pred"}.get(dtype, dtype)


def saturate(programs: Programs, extra_terms: list[Term] = (), iterations: int = MAX_ITERATIONS) -> Proof:
    t0 = time.perf_counter()
    egraph = EGraph()
    loader = Loader(egraph)
    for t in programs.reference_outputs:
        loader.expr(t)
    reference_values = list(programs.params)
    for event in programs.reference_events:
        reference_values.extend(flatten(event.values[0]))
    for t in reference_values:
        egraph.register(L.related(loader.expr(t)), L.reference(loader.expr(t)))
    for dev_out, dev_targets in zip(programs.device_outputs, programs.targets):
        for t in dev_out + dev_targets:
            loader.expr(t)
    for t in extra_terms:
        loader.expr(t)
    for group in programs.evaluator.equal_terms:
        first = loader.expr(group[0])
        egraph.register(*[union(first).with_(loader.expr(t)) for t in group[1:]])
    loader.flush()
    _run(egraph, iterations)
    proved = []
    for dev_out, dev_targets in zip(programs.device_outputs, programs.targets):
        proved.append([proved_equal(egraph, loader.expr(o), loader.expr(t)) for o, t in zip(dev_out, dev_targets)])
    return Proof(proved, egraph, loader, time.perf_counter() - t0, programs.targets)


def _run(egraph: EGraph, iterations: int) -> None:
    egraph.run((L.dims.saturate() + L.relations.saturate() + L.REWRITES) * iterations)
    egraph.run(L.dims.saturate() + L.relations.saturate())


def add_terms(proof: Proof, terms: list[Term], iterations: int = MAX_ITERATIONS) -> None:
    """Load more terms (hypotheses for localization) and saturate again."""
    new = [t for t in terms if t not in proof.loader.exprs]
    if not new:
        return
    for t in new:
        proof.loader.expr(t)
    proof.loader.flush()
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
