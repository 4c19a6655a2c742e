"""Verify one captured model: prove, else look for a counterexample, else say where proof stops."""

from __future__ import annotations

import re
import time

from equivci.capture.types import CapturedModel
from equivci.hlo.parser import HloParseError, parse_module
from equivci.manifest import Manifest, ModelSpec
from equivci.results import Finding, LayerCounts, ModelResult, Status
from equivci.verify.instantiate import Unsupported
from equivci.verify.localize import Defect, source_of
from equivci.verify.loops import defect_with_loops
from equivci.verify.prove import build_programs, saturate

# Run the numeric oracle only where random inputs are cheap to draw and run on a CPU.
MAX_ORACLE_ELEMENTS = 1 << 22


def verify_model(model: ModelSpec, manifest: Manifest, captured: CapturedModel) -> ModelResult:
    t0 = time.perf_counter()
    try:
        reference = parse_module(captured.reference_hlo)
        distributed = parse_module(captured.distributed_hlo)
        programs = build_programs(reference, distributed, captured.inputs, captured.outputs, captured.num_devices)
    except (HloParseError, Unsupported) as exc:
        finding = Finding(None, None, "error", None, f"equivci cannot model this program yet: {exc}")
        return _finish(model, manifest, Status.UNPROVEN, t0, (finding,), verified=False)
    proof = saturate(programs)
    if proof.all_proved:
        return _finish(model, manifest, Status.VERIFIED, t0, (), verified=True)

    defect = defect_with_loops(programs, proof, captured.mesh)
    findings = [_finding(defect, captured)] if defect else [_output_finding(proof, captured)]
    counterexample = _counterexample(model, manifest, captured)
    if counterexample is not None:
        findings.append(Finding(findings[0].path, findings[0].line, "error", None, counterexample))
        return _finish(model, manifest, Status.MISMATCH, t0, tuple(findings), verified=False)
    return _finish(model, manifest, Status.UNPROVEN, t0, tuple(findings), verified=False)


def _finish(model, manifest, status, t0, findings, verified: bool) -> ModelResult:
    layers = LayerCounts(total=1, verified=1 if verified else 0, reused=0)
    return ModelResult(model.name, status, round(time.perf_counter() - t0, 3), layers, tuple(findings))


_SCOPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def layer_of(op_name: str) -> str | None:
    """The user's outermost named scope in an op_name (`jit(f)/layers_3/dot_general` -> `layers_3`)."""
    parts = [p for p in op_name.split("/")[:-1] if not p.startswith(("jit(", "pjit(", "shard_map"))]
    return parts[0] if parts and _SCOPE.match(parts[0]) else None


def _finding(defect: Defect, captured: CapturedModel) -> Finding:
    path, line = source_of(defect.inst, captured.repo_root)
    message = defect.message
    if defect.context is not None:
        cpath, cline = source_of(defect.context, captured.repo_root)
        where = f"{cpath}:{cline}" if cpath else defect.context.name
        message += f" (it is combined with the other operand at {where}, `{defect.context.opcode}`)"
    return Finding(path, line, "error", layer_of(defect.inst.op_name), message, op=defect.inst.name)


def _output_finding(proof, captured: CapturedModel) -> Finding:
    bad = [(dev, k) for dev, row in enumerate(proof.proved) for k, ok in enumerate(row) if not ok]
    dev, k = bad[0]
    leaf = captured.outputs[k]
    return Finding(None, None, "error", None,
                   f"output {leaf.path or '#' + str(k)} on device {dev} could not be shown equal to its part of the "
                   "reference output, and every op before it is related to the reference: the output placement "
                   "(out_specs / out_shardings) may not match what the devices hold")


def _counterexample(model: ModelSpec, manifest: Manifest, captured: CapturedModel) -> str | None:
    total = sum(_size(leaf.shape) for leaf in captured.inputs)
    if total > MAX_ORACLE_ELEMENTS:
        return None
    try:
        from equivci.capture.numeric import compare_in_child
    except ImportError:
        return None
    result = compare_in_child(manifest.path, model.name)
    if result is None or result.equal:
        return None
    index = ",".join(map(str, result.worst_index))
    return (f"counterexample: on random inputs output {result.worst_leaf}[{index}] is {result.dist_value:.6g} "
            f"distributed vs {result.ref_value:.6g} reference (largest difference {result.max_abs_diff:.3g})")


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
