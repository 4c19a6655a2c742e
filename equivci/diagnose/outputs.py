"""Outputs whose dtype differs between the two programs: a refutation without a search.

The contract counts a changed dtype as a different function (a bf16 logit is not the f32 logit,
whatever the values), so such a model is `mismatch` before any proof runs, with the finding at the
distributed op that makes the output.
"""

from __future__ import annotations

from equivci.diagnose.localize import source_of
from equivci.hlo.ir import Computation, Instruction, Module, Shape
from equivci.results import Finding

# Ops that hand an output through unchanged (JAX's copies, sharding annotations, tuples): the
# line a reviewer would change is the op behind them.
_PASS_THROUGH = {"copy", "tuple", "get-tuple-element", "bitcast", "call", "opt-barrier"}
_PASS_THROUGH_CALLS = ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape")
_MAX_STEPS = 64


def dtype_findings(reference: Module, distributed: Module, leaf_paths: list[str], repo_root: str) -> list[Finding]:
    """One error finding per output leaf whose element type differs between the programs."""
    ref_leaves = _leaves(reference.entry.root.shape)
    dist_leaves = _leaves(distributed.entry.root.shape)
    findings = []
    for k, (ref, dist) in enumerate(zip(ref_leaves, dist_leaves)):
        if ref.dtype == dist.dtype:
            continue
        name = leaf_paths[k] if k < len(leaf_paths) and leaf_paths[k] else f"#{k}"
        inst = _maker(distributed, distributed.entry, _output_operand(distributed.entry, k, len(dist_leaves)))
        path, line = source_of(inst, repo_root) if inst is not None else (None, None)
        where = "" if path else f" (HLO instruction `{inst.name}`)" if inst is not None else ""
        findings.append(
            Finding(
                path,
                line,
                "error",
                None,
                f"output {name} is {dist.dtype} in the distributed program but {ref.dtype} in the "
                f"reference{where}: a changed dtype is a different function; cast it back to "
                f"{ref.dtype} or change the reference",
            )
        )
    return findings


def _leaves(shape: Shape) -> list[Shape]:
    return [leaf for e in shape.elements for leaf in _leaves(e)] if shape.is_tuple else [shape]


def _output_operand(entry: Computation, k: int, count: int) -> Instruction | None:
    root = entry.root
    if root.opcode == "tuple" and len(root.operands) == count:
        return _by_name(entry, root.operands[k])
    return root


def _by_name(comp: Computation, name: str) -> Instruction | None:
    return next((i for i in comp.instructions if i.name == name), None)


def _passes_through(inst: Instruction) -> bool:
    if inst.opcode == "custom-call":
        return inst.attrs.get("custom_call_target", "").strip('"') in _PASS_THROUGH_CALLS
    return inst.opcode in _PASS_THROUGH


def _maker(module: Module, comp: Computation, inst: Instruction | None) -> Instruction | None:
    """The first op behind `inst`'s pass-through wrappers, into called computations."""
    nxt: Instruction | None
    for _ in range(_MAX_STEPS):
        if inst is None or not _passes_through(inst):
            return inst
        if inst.opcode == "call":
            comp = module.computations[inst.attrs["to_apply"].lstrip("%")]
            nxt = comp.root
        elif (
            inst.opcode == "get-tuple-element"
            and (src := _by_name(comp, inst.operands[0])) is not None
            and src.opcode in ("call", "tuple")
        ):
            index = int(inst.attrs.get("index", "0"))
            if src.opcode == "tuple":
                nxt = _by_name(comp, src.operands[index])
            else:
                comp = module.computations[src.attrs["to_apply"].lstrip("%")]
                root = comp.root
                nxt = _by_name(comp, root.operands[index]) if root.opcode == "tuple" else root
        elif inst.operands:
            nxt = _by_name(comp, inst.operands[0])
        else:
            return inst
        inst = nxt
    return inst
