"""Verify one captured model: prove, else look for a counterexample, else say where proof stops."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from equivci.cache import Memo
from equivci.capture.hlo_oracle import compare_hlo_in_child
from equivci.capture.oracle import (
    NOISE_MARGIN,
    NumericComparison,
    Ranges,
    compare_in_child,
    default_int_high,
    float_shapes,
)
from equivci.capture.types import CapturedModel, LeafPlacement
from equivci.diagnose.findings import defect_findings, with_counterexample, with_note
from equivci.diagnose.localize import source_of
from equivci.diagnose.loops import defect_with_loops
from equivci.diagnose.numeric import draw_inputs, numeric_frontier
from equivci.diagnose.outputs import dtype_findings
from equivci.errors import EquivciError
from equivci.hlo.collectives import axis_groups
from equivci.hlo.parser import HloParseError, parse_module
from equivci.layers.segments import split
from equivci.manifest import Manifest, ModelSpec
from equivci.options import (
    ENV_SATURATION_ITERATIONS,
    ENV_SATURATION_NODES,
    ENV_VERIFY_MEMORY,
    SATURATION_NODES,
    Budgets,
)
from equivci.prove import memory
from equivci.prove.candidates import window_candidates
from equivci.prove.layered import prove_layers
from equivci.prove.programs import build_programs
from equivci.prove.saturate import GROWTH, MAX_ITERATIONS, Proof, saturate, with_hints
from equivci.results import Finding, LayerCounts, ModelResult, Status
from equivci.timings import Laps
from equivci.translate.builder import Unsupported
from equivci.verify.prefix import Diagnosis, diagnose_prefix


def verify_model(
    model: ModelSpec,
    manifest: Manifest,
    captured: CapturedModel,
    memo: Memo | None = None,
    on_layer=None,
    iterations: int = MAX_ITERATIONS,
    budgets: Budgets = Budgets(),
) -> ModelResult:
    """`memo` serves and stores layer proofs (kind "layers"); without one, identical layers are
    still proved once within the model. `on_layer(done, total)` after each layer. `iterations`:
    the saturation budget (each saturation allows at least the depth of its terms); `budgets`: the
    other limits of every stage."""
    t0 = time.perf_counter()
    laps = Laps(t0)
    try:
        reference = parse_module(captured.reference_hlo)
        distributed = parse_module(captured.distributed_hlo)
        laps.lap("parse HLO")
        changed = dtype_findings(reference, distributed, [leaf.path for leaf in captured.outputs], captured.repo_root)
        if changed:
            return _finish(model, Status.MISMATCH, t0, tuple(changed), LayerCounts(1, 0, 0), laps)
        programs = build_programs(
            reference,
            distributed,
            captured.inputs,
            captured.outputs,
            captured.num_devices,
            iterations,
            budgets,
            model.int_range,
        )
        laps.lap("build programs")
    except (HloParseError, Unsupported) as exc:
        finding = Finding(None, None, "error", None, f"equivci cannot model this program yet: {exc}")
        return _finish(model, Status.UNPROVEN, t0, (finding,), LayerCounts(1, 0, 0), laps)
    # The layer proofs do not carry the initial-state obligations of loops: such models are proved whole.
    layering = (
        None
        if programs.obligations
        else split(
            programs.reference_events,
            programs.distributed_events,
            programs.reference_outputs,
            programs.device_outputs,
            programs.targets,
        )
    )
    laps.lap("split layers")
    layers = LayerCounts(1, 0, 0)
    if layering is not None:
        layered = prove_layers(programs, layering, memo if memo is not None else Memo(None), on_layer, iterations)
        outcomes = layered.layers
        layers = LayerCounts(len(outcomes), sum(o.proved for o in outcomes), sum(o.reused for o in outcomes))
        laps.lap(f"prove layers ({layers.total - layers.reused} new, {layers.reused} reused)")
        if layered.all_proved:
            return _proved(model, programs, captured, t0, LayerCounts(layers.total, layers.total, layers.reused), laps)
    # The layers alone do not prove it (a relation between layers that is not a window, or a
    # real defect): prove the whole program, which also gives the localization its e-graph; on a
    # big model only up to the first unproved layer, where the first defect is (kept in the memo:
    # a change after that layer finds it there).
    # the integer values the numeric check draws: its hints, its localization and its notes read the same
    ranges = oracle_ranges(model, programs.assumed, captured.inputs)
    proof: Proof | None
    searched: Proof | Diagnosis  # what the budget note reads: the search's budget and whether it ran out
    if layering is not None and len(programs.evaluator.table) > budgets.whole_program_terms:
        diagnosis = diagnose_prefix(
            programs,
            layering,
            layered.layers,
            captured.mesh,
            iterations,
            memo if memo is not None else Memo(None),
            laps,
        )
        proof, defect, searched = diagnosis.proof, diagnosis.defect, diagnosis
    else:
        proof = saturate(programs, iterations=iterations)
        laps.lap("prove whole program")
        # Proposed windows only join an e-graph the rules saturated: one still growing would
        # grow the more with them (and a proof there is the budget's, not the hints').
        if not proof.all_proved and not proof.exhausted and not proof.outgrown:
            hints = _candidates(programs, captured, ranges)
            if hints:
                proof = with_hints(proof, programs, hints, budgets.hinted_iterations)
                laps.lap(f"prove whole program with {len(hints)} proposed windows")
        defect = None if proof.all_proved else defect_with_loops(programs, proof, captured.mesh)
        searched = proof
        if not proof.all_proved:
            laps.lap("localize")
    if proof is not None and proof.all_proved:
        return _proved(model, programs, captured, t0, LayerCounts(layers.total, layers.total, layers.reused), laps)

    comparison, transient = _comparison(model, manifest, captured, ranges, budgets)
    laps.lap("counterexample")
    if defect is None:
        assert proof is not None  # a diagnosis from the memo always names a defect
        findings = [_output_finding(proof, captured)]
    else:
        frontier = numeric_frontier(
            programs.reference_events,
            programs.distributed_events,
            programs.evaluator.values,
            captured.inputs,
            axis_groups(captured.mesh),
            len(programs.evaluator.table),
            programs.routed,
            budgets,
            ranges,
            defect.frontier or defect.inst,
        )
        laps.lap("numeric localization")
        failed = {o.name for o in layered.layers if not o.proved and o.name} if layering is not None else set()
        reference_lines = frozenset((loc.file, loc.line) for e in programs.reference_events for loc in e.inst.stack)
        findings = defect_findings(
            defect,
            captured,
            programs.distributed_events,
            layering,
            failed,
            frontier,
            outputs_equal=isinstance(comparison, NumericComparison)
            and comparison.equal
            and not comparison.excused_seeds,
            shown=isinstance(comparison, NumericComparison) and not comparison.equal,
            reference_events=programs.reference_events,
            reference_lines=reference_lines,
            entry=_entry(model),
            foreign=_foreign(model, manifest),
        )
    drawn = _integer_draws(model, ranges, captured.inputs)
    if isinstance(comparison, NumericComparison) and not comparison.equal:
        findings = with_counterexample(findings, _counterexample(comparison) + drawn)
        return _finish(model, Status.MISMATCH, t0, tuple(findings), layers, laps)
    findings = with_note(
        findings, _numeric_note(comparison) + (drawn if isinstance(comparison, NumericComparison) else "")
    )
    for limit in programs.limits:
        findings = with_note(findings, limit)
    outcomes = layered.layers if layering is not None else []
    budget = _budget_note(programs, searched, outcomes, iterations)
    # Not cached: a numeric check that failed to run, or a search stopped by the memory cap (which
    # the content key does not hold), may end otherwise in the next run.
    limited = transient or bool(searched.memory) or any(o.memory for o in outcomes)
    return _finish(model, Status.UNPROVEN, t0, tuple(findings) + budget, layers, laps, limited)


def _entry(model: ModelSpec) -> tuple[str, str] | None:
    """(file, function) of the distributed entrypoint, when it is given as a file."""
    entry = model.distributed
    return (str(entry.file), entry.function) if entry is not None and entry.file is not None else None


def _foreign(model: ModelSpec, manifest: Manifest) -> tuple[tuple[str, str], ...]:
    """(file, function) of the distributed entrypoints of the manifest's models checked against
    another reference than `model`'s."""
    ref = model.reference
    return tuple(
        (str(m.distributed.file), m.distributed.function)
        for m in manifest.models
        if ref is not None
        and m.reference is not None
        and (m.reference.file, m.reference.function) != (ref.file, ref.function)
        and m.distributed is not None
        and m.distributed.file is not None
    )


def _budget_note(programs, proof, layers, setting: int | None = None) -> tuple[Finding, ...]:
    """Say so when `unproven` may be the budget's doing: a saturation that failed to prove what it was
    asked stopped at its iteration or size budget while the rules could still add facts. `setting`:
    the iteration budget asked for (EQUIVCI_SATURATION_ITERATIONS), by default the proof's."""
    iterations = proof.iterations if setting is None else setting
    return _iterations_note(programs, proof, layers, iterations) + _size_note(programs, proof, layers)


def _first_stop(programs, proof, layers, of_layer, of_proof) -> tuple[str, Any] | None:
    """("the whole program and 2 more", what) for the first saturation that stopped at a budget
    among the layers', the unproved loop bodies' and the whole program's; `of_layer` / `of_proof`
    give what stopped one, or None."""
    stops = [(f"layer {o.name}" if o.name else "a layer", of_layer(o)) for o in layers if of_layer(o)]
    stops += [
        ("a loop body", of_proof(a.proof))
        for a in programs.loops
        if not a.proved and a.proof is not None and of_proof(a.proof)
    ]
    if of_proof(proof):
        stops.append(("the whole program", of_proof(proof)))
    if not stops:
        return None
    where, what = stops[0]
    return (f"{where} and {len(stops) - 1} more" if len(stops) > 1 else where), what


def _size_note(programs, proof, layers) -> tuple[Finding, ...]:
    outgrown = _first_stop(
        programs,
        proof,
        layers,
        lambda o: (*o.outgrown, o.memory) if o.outgrown[0] else None,
        lambda p: (p.outgrown, p.node_budget, p.memory) if p.outgrown else None,
    )
    if outgrown is None:
        return ()
    where, (rows, budget, predicted) = outgrown
    if predicted:
        cap = memory.cap()
        message = (
            f"the proof search of {where} stopped when its e-graph held {rows:,} nodes: one more pass, "
            f"taking as much more memory than the last as the square of its growth, would have needed "
            f"about {predicted / 2**30:.1f} GiB, more than {memory.SHARE:g} of its memory cap of "
            f"{cap / 2**30:.1f} GiB, while its rules were still adding facts; set {ENV_VERIFY_MEMORY} "
            f"to {2 * cap} (bytes) to raise it where the machine has the memory"
        )
    else:
        message = (
            f"the proof search of {where} stopped when its e-graph held {rows:,} nodes and one more pass, "
            f"growing it as much as the last, would have taken it past its size budget of {budget:,}, while its "
            "rules were still adding facts, so a larger budget may prove it: the budget is "
            f"{ENV_SATURATION_NODES} where set, else {GROWTH} times the nodes the terms load and at most "
            f"{SATURATION_NODES:,}; set {ENV_SATURATION_NODES}={2 * budget} to raise it (a node takes about 350 "
            "bytes)"
        )
    return (Finding(None, None, "note", None, message),)


def _iterations_note(programs, proof, layers, setting: int) -> tuple[Finding, ...]:
    stopped = _first_stop(programs, proof, layers, lambda o: o.exhausted or None, lambda p: p.exhausted or None)
    if stopped is None:
        return ()
    where, budget = stopped
    if where == "the whole program" and isinstance(proof, Proof) and proof.hinted:
        # Windows are proposed only to a search whose rules reached a fixed point: the budget that
        # ran out is the proposals' own, which the setting does not raise (split 16's paged
        # decode: with 120 passes, that search too reached a fixed point, unproved).
        message = (
            f"the proof search of the whole program reached a fixed point without a proof; with the "
            f"{proof.hinted} windows of reference values that random inputs proposed, it then stopped at "
            f"their budget of {budget} saturation iterations (the larger of the terms' depth and "
            f"{proof.iterations}) while its rules could still add facts; {ENV_SATURATION_ITERATIONS} does "
            "not raise that budget"
        )
    else:
        message = (
            f"the proof search of {where} stopped at its budget of {budget} saturation iterations while "
            "its rules could still add facts, so a larger budget may prove it: the budget is the larger of "
            f"the terms' depth and {ENV_SATURATION_ITERATIONS} ({setting} now); set "
            f"{ENV_SATURATION_ITERATIONS}={2 * budget} to raise it"
        )
    return (Finding(None, None, "note", None, message),)


def _candidates(programs, captured: CapturedModel, ranges: Ranges) -> list:
    """Windows of reference values that distributed values equal on the oracle's first draw: terms
    for the proof to meet (candidates only; the proof decides). None where that draw is not cheap."""
    if (
        len(programs.evaluator.table) > programs.evaluator.budgets.numeric_terms
        or sum(_size(leaf.shape) for leaf in captured.inputs) > programs.evaluator.budgets.numeric_elements
    ):
        return []
    try:
        params = draw_inputs(captured.inputs, ranges=ranges)
    except Exception:  # noqa: BLE001 - hints only: without them the proof stands as it is
        return []
    return window_candidates(programs.reference_events, programs.distributed_events, programs.evaluator, params)


def _assumptions(model: ModelSpec, programs, captured: CapturedModel) -> tuple[Finding, ...]:
    """Notes on what a proof took for granted: integer inputs the reference indexes with are valid
    indices (outside [0, size) the programs may differ: numpy wraps negative ids, JAX clamps), and
    those it slices at are valid slice starts (outside [0, n - size] HLO clamps them). Not for an
    input whose range the manifest states inside those (`int_range`): nothing is taken there."""
    notes = []
    for k, ((lo, hi), site) in sorted(programs.assumed.items()):
        if model.int_range is not None and lo <= model.int_range[0] and model.int_range[1] - 1 <= hi:
            continue
        path, line = next((loc for loc in (source_of(i, captured.repo_root) for i in site) if loc[0]), (None, None))
        leaf = captured.inputs[k].path or f"#{k}"
        notes.append(
            Finding(
                path,
                line,
                "note",
                None,
                f"proved for input {leaf} in [{int(lo)}, {int(hi)}]: "
                "the reference uses it as an index (or a slice start) here, and other values are taken not to occur",
            )
        )
    return tuple(notes)


def _proved(model: ModelSpec, programs, captured: CapturedModel, t0, layers: LayerCounts, laps: Laps) -> ModelResult:
    """`verified`, with notes on what the proof assumed; `unproven` when it assumed valid index
    inputs and the manifest refuses that (`assume_valid_indices: false`)."""
    notes = _assumptions(model, programs, captured)
    if notes and not model.assume_valid_indices:
        refused = tuple(
            dataclasses.replace(
                n,
                severity="error",
                message=n.message + "; `assume_valid_indices: false` in the manifest refuses such proofs "
                "(remove it to accept the proof with this note)",
            )
            for n in notes
        )
        return _finish(model, Status.UNPROVEN, t0, refused, layers, laps)
    return _finish(model, Status.VERIFIED, t0, notes + _stated_range(model, captured), layers, laps)


def _stated_range(model: ModelSpec, captured: CapturedModel) -> tuple[Finding, ...]:
    """The note that a proof holds for the integer inputs' range the manifest states."""
    integers = [
        leaf.path or f"#{k}" for k, leaf in enumerate(captured.inputs) if str(leaf.dtype).startswith(("int", "uint"))
    ]
    if model.int_range is None or not integers:
        return ()
    lo, hi = model.int_range
    message = (
        f"proved for integer inputs ({', '.join(integers)}) in [{lo}, {hi}), the manifest's `int_range`: "
        "other values are taken not to occur"
    )
    return (Finding(None, None, "note", None, message),)


def _finish(model, status, t0, findings, layers: LayerCounts, laps: Laps, limited: bool = False) -> ModelResult:
    seconds = round(time.perf_counter() - t0, 3)
    return ModelResult(model.name, status, seconds, layers, tuple(findings), timings=tuple(laps.rows), limited=limited)


def _output_finding(proof, captured: CapturedModel) -> Finding:
    bad = [(dev, k) for dev, row in enumerate(proof.proved) for k, ok in enumerate(row) if not ok]
    dev, k = bad[0]
    leaf = captured.outputs[k]
    return Finding(
        None,
        None,
        "error",
        None,
        f"output {leaf.path or '#' + str(k)} on device {dev} could not be shown equal to its part of the "
        "reference output, and every op before it is related to the reference: the output placement "
        "(out_specs / out_shardings) may not match what the devices hold",
    )


def _comparison(
    model: ModelSpec, manifest: Manifest, captured: CapturedModel, ranges: Ranges, budgets: Budgets
) -> tuple[NumericComparison | str, bool]:
    """Both programs run on random inputs (the numeric oracle), or why that did not happen, and
    whether that may change in another run (the check was tried and failed: its time limit, a crash).
    `ranges`: where it draws the integer inputs (oracle_ranges);
    `budgets`: the input elements the oracle runs on a CPU and how long its child may take."""
    most, timeout = budgets.oracle_elements, budgets.oracle_timeout_seconds
    total = sum(_size(leaf.shape) for leaf in captured.inputs)
    if model.hlo is not None:
        # Programs given as HLO files: XLA runs them as the capture rewrote them.
        if total > most:
            return (
                f"the numeric check did not run: the inputs have {total:,} elements, more than the "
                f"{most:,} it runs on a CPU, so this is `unproven`, never `mismatch` by a "
                "counterexample; dump the programs at smaller sizes to have them run"
            ), False
        try:
            return compare_hlo_in_child(captured, ranges, timeout=timeout), False
        except EquivciError as exc:
            return (
                f"the numeric check could not run: {exc}; so this is `unproven`, never `mismatch` by a counterexample"
            ), True
    if total > most and model.oracle.inputs is None:
        return (
            f"the numeric check did not run: the inputs have {total:,} elements, more than the "
            f"{most:,} it runs on a CPU; give it smaller inputs the entrypoints accept with "
            "`oracle: {inputs: FILE.py:FUNC}` in the manifest"
        ), False
    try:
        return compare_in_child(manifest.path, model.name, timeout=timeout, ranges=ranges), False
    except EquivciError as exc:
        return f"the numeric check could not run: {exc}", True


def oracle_ranges(model: ModelSpec, assumed: dict, inputs: tuple[LeafPlacement, ...] = ()) -> Ranges:
    """The oracle draws the inputs the proof assumed valid indices inside the same ranges: outside
    them the programs may differ (numpy wraps a negative index, HLO clamps a slice start), and a
    difference there is no counterexample to a claim that was never made. Not when the manifest
    refuses the assumption (`assume_valid_indices: false`): then every value is an input. Every
    integer input of `inputs` inside the manifest's `int_range` too: no other value occurs."""
    ranges: Ranges = (
        {k: (int(lo), int(hi) + 1) for k, ((lo, hi), _) in assumed.items()} if model.assume_valid_indices else {}
    )
    if model.int_range is None:
        return ranges
    lo, hi = model.int_range
    for k, leaf in enumerate(inputs):
        if str(leaf.dtype).startswith(("int", "uint")):
            was = ranges.get(k, (lo, hi))
            ranges[k] = (max(lo, was[0]), min(hi, was[1])) if max(lo, was[0]) < min(hi, was[1]) else (lo, hi)
    return ranges


def _numeric_note(comparison: NumericComparison | str) -> str:
    if isinstance(comparison, str):
        return comparison
    # The floor is printed because a large one (an ill-conditioned output: Adam's first step is
    # about sign(g)) makes "agree" weak evidence, and the reader should see how weak.
    floor = (
        f"; rounding alone moves the reference's outputs by up to {comparison.noise_floor:.3g}, and "
        f"differences up to {NOISE_MARGIN:g}x that are not counted"
        if comparison.noise_floor
        else ""
    )
    if comparison.excused_seeds:
        # Seeds excused by a near-tie differ, maybe far beyond the floor: never call that agreement.
        return (
            f"numeric check: the outputs differ on random inputs (largest difference {comparison.max_abs_diff:.3g}"
            f"{floor}), but {comparison.note}: rounding may explain it, so equivci cannot tell a defect "
            "from rounding here; review the op above"
        )
    excused = f"; {comparison.note}" if comparison.note else ""
    return (
        f"numeric check: the outputs agree on {len(comparison.seeds)} random inputs (largest difference "
        f"{comparison.max_abs_diff:.3g}{floor}{excused}); that is evidence, not a proof: review the op above"
    )


def _integer_draws(model: ModelSpec, ranges: Ranges, inputs: tuple[LeafPlacement, ...]) -> str:
    """Which integer values the numeric check drew, where the manifest states no `int_range`: code
    that is right only for the ids it is meant for (a table lookup at a position, a chunk start)
    differs outside them, and agreement on a narrow draw is weak evidence. The reader weighs both."""
    integers = [(k, leaf) for k, leaf in enumerate(inputs) if leaf.dtype.startswith(("int", "uint"))]
    if model.int_range is not None or model.oracle.inputs is not None or not integers:
        return ""
    high = default_int_high(float_shapes((leaf.shape, leaf.dtype) for leaf in inputs))
    drawn = {k: ranges.get(k, (0, high)) for k, _ in integers}
    shown = [f"input {leaf.path or '#' + str(k)} in [{drawn[k][0]}, {drawn[k][1]})" for k, leaf in integers[:4]]
    more = f" and {len(integers) - 4} more" if len(integers) > 4 else ""
    return (
        f"; the integer inputs were drawn as {', '.join(shown)}{more}: if the programs are meant for other "
        "values, state them with `int_range: [lo, hi]` in the manifest"
    )


def _counterexample(result: NumericComparison) -> str:
    index = ",".join(map(str, result.worst_index))
    return (
        f"counterexample: on random inputs output {result.worst_leaf}[{index}] is {result.dist_value:.6g} "
        f"distributed vs {result.ref_value:.6g} reference ({result.figures()}; largest difference "
        f"{result.max_abs_diff:.3g})"
    )


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
