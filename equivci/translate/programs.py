"""Both programs, reference and distributed, translated to terms over the reference inputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from equivci.capture.types import LeafPlacement
from equivci.hlo.ir import Module
from equivci.options import Budgets
from equivci.terms.ir import Term, TermTable
from equivci.translate.bounds import index_domains
from equivci.translate.evaluator import Evaluator, Event, Loop, LoopHandler
from equivci.translate.permutations import Permutations
from equivci.translate.routing import Router
from equivci.translate.unroll import Unroller


class LoopProver(LoopHandler, Protocol):
    attempts: list  # what became of each distributed `while` (equivci.prove.loops.LoopAttempt)
    unrolled: int  # how many of them were unrolled


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
    loops: list = dataclasses.field(default_factory=list)  # prove.loops.LoopAttempt, in program order
    # input index -> (its assumed [lo, hi], the reference gather that makes it an index and the calls it is in)
    assumed: dict = dataclasses.field(default_factory=dict)
    # what the verifier did not try, and why (a dispatch mask past the routing lemma's enumeration bound)
    limits: list[str] = dataclasses.field(default_factory=list)
    # values the reference builds inside its ops (Builder.inner_values)
    reference_inner: list[Term] = dataclasses.field(default_factory=list)

    def reference_values(self) -> list[Term]:
        """The reference's inputs, the values of its ops and the values built inside them."""
        return [*self.params, *(v for e in self.reference_events for v in flatten(e.values[0])), *self.reference_inner]


def flatten(value) -> list[Term]:
    """The leaves of a (nested) tuple of terms."""
    return [leaf for item in value for leaf in flatten(item)] if isinstance(value, tuple) else [value]


def translate(
    reference: Module,
    distributed: Module,
    inputs: tuple[LeafPlacement, ...],
    outputs: tuple[LeafPlacement, ...],
    num_devices: int,
    loops: Callable[[Module, list[Loop]], LoopProver],
    budgets: Budgets = Budgets(),
    int_range: tuple[int, int] | None = None,
) -> Programs:
    """Both programs as terms over the reference inputs; `int_range`: [lo, hi) of every integer
    input, as the manifest states it (their bounds). `loops(reference, reference_loops)` makes
    the handler of the distributed program's `while` ops (equivci.prove.loops.LoopMatcher).

    The reference's loops are kept whole (a distributed loop is best related to one by an invariant)
    unless the handler unrolled a distributed loop (equivci.translate.unroll), or the distributed
    program runs no loop at all (a scan written as a Python loop or as `lax.associative_scan`: no
    invariant can relate a loop to straight-line code): the reference's loops with a constant trip
    count are then unrolled too, so that both programs are straight-line code."""
    args = (reference, distributed, inputs, outputs, num_devices, loops, budgets, int_range)
    programs, again = _translate(*args, unroll=False)
    if again:
        programs, _ = _translate(*args, unroll=True)
    return programs


def _translate(
    reference: Module,
    distributed: Module,
    inputs: tuple[LeafPlacement, ...],
    outputs: tuple[LeafPlacement, ...],
    num_devices: int,
    loops: Callable[[Module, list[Loop]], LoopProver],
    budgets: Budgets,
    int_range: tuple[int, int] | None,
    unroll: bool,
) -> tuple[Programs, bool]:
    """The programs, and whether to build them again with the reference's loops unrolled."""
    table = TermTable()
    params = [table.make("param", (k,), (), leaf.shape, _short_dtype(leaf.dtype)) for k, leaf in enumerate(inputs)]
    # The integer inputs' range the manifest states: every value of them lies there.
    ranged = (
        {p: (float(int_range[0]), float(int_range[1] - 1)) for p in params if p.dtype[0] in "su"}
        if int_range is not None
        else {}
    )

    ref_eval = Evaluator(reference, table, 1, budgets)
    ref_eval.loop_handler = Unroller() if unroll else None
    ref_eval.bounds.update(ranged)
    ref_root = ref_eval.run(reference.entry, [[p] for p in params])[0]
    # Integer inputs the reference uses as indices are taken to be valid indices, [0, size): the
    # programs are compared on the inputs the reference is written for (the numeric oracle draws
    # them there too). Known before evaluation, the bounds fold the reference's own range checks.
    domains = index_domains(ref_eval)
    bounds = dict(ranged)
    for p, ((lo, hi), _) in domains.items():
        was = bounds.get(p, (lo, hi))
        if max(lo, was[0]) <= min(hi, was[1]):
            bounds[p] = (max(lo, was[0]), min(hi, was[1]))
    if domains:
        ref_eval = Evaluator(reference, table, 1, budgets)
        ref_eval.loop_handler = Unroller() if unroll else None
        ref_eval.bounds.update(bounds)
        ref_root = ref_eval.run(reference.entry, [[p] for p in params])[0]
    reference_outputs = flatten(ref_root)

    dist_eval = Evaluator(distributed, table, num_devices, budgets)
    dist_eval.equal_terms.extend(ref_eval.equal_terms)  # what the builder found on the reference's side
    dist_eval.bounds.update(bounds)
    dist_eval.values.update(ref_eval.values)
    dist_eval.constants.extend(ref_eval.constants)
    dist_eval.boxes.update(ref_eval.boxes)  # the reference's group pieces, which devices compute too
    dist_eval.one_hots.update((x, list(found)) for x, found in ref_eval.one_hots.items())
    matcher = loops(reference, ref_eval.loops)
    dist_eval.loop_handler = matcher
    dist_args = [
        [dist_eval.slice_nd(p, leaf.device_slices[dev]) for dev in range(num_devices)]
        for p, leaf in zip(params, inputs)
    ]
    dist_root = dist_eval.run(distributed.entry, dist_args)
    device_outputs = [flatten(dist_root[dev]) for dev in range(num_devices)]
    targets = [
        [dist_eval.slice_nd(r, leaf.device_slices[dev]) for r, leaf in zip(reference_outputs, outputs)]
        for dev in range(num_devices)
    ]
    router = Router(dist_eval, num_devices)
    router.run(dist_eval.events)
    dist_eval.equal_terms.extend([a, b] for a, b in router.facts)
    # Sort-based dispatch undone in both programs (a global sort against per-shard sorts).
    # The distributed roots include the terms the builder stated equal to its values (a sum over
    # devices stated as the map of a sum holds the put-back of that sum).
    stated = [t for group in dist_eval.equal_terms for t in group]
    dist_roots = [t for out in device_outputs for t in out] + stated
    for evaluator, roots in ((ref_eval, reference_outputs), (dist_eval, dist_roots)):
        permutations = Permutations(evaluator)
        permutations.run(roots)
        dist_eval.equal_terms.extend([a, b] for a, b in permutations.facts)
    programs = Programs(
        params,
        reference_outputs,
        device_outputs,
        targets,
        ref_eval.events,
        dist_eval.events,
        dist_eval,
        router.exempt,
        dist_eval.obligations,
        matcher.attempts,
        {p.attrs[0]: domain for p, domain in domains.items()},
        router.limits,
        ref_eval.inner_values,
    )
    straight = matcher.unrolled > 0 or not matcher.attempts
    return programs, not unroll and straight and bool(ref_eval.loops)


def _short_dtype(dtype: str) -> str:
    return {
        "float32": "f32",
        "float64": "f64",
        "bfloat16": "bf16",
        "float16": "f16",
        "int32": "s32",
        "int64": "s64",
        "uint32": "u32",
        "uint8": "u8",
        "int8": "s8",
        "bool": "pred",
    }.get(dtype, dtype)
