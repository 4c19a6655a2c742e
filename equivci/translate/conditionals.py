"""HLO `conditional` (lax.cond, lax.switch) as the branch it takes, or a select of its branches.

`conditional(p, a, b)` with `true_computation=T, false_computation=F` is T(a) where p holds, else
F(b); `conditional(i, x_0, .., x_{n-1})` with `branch_computations={B_0, .., B_{n-1}}` is B_i(x_i),
and B_{n-1}(x_{n-1}) for an index outside [0, n) (XLA's rule). HLO is pure, so the value is the
same as computing every branch and selecting: select(p, T(a), F(b)), and for an index the chain
select(i == 0, B_0, select(i == 1, B_1, .. B_{n-1})). Where the device folds the predicate or index
to a constant (a pipeline stage's `axis_index == 0`, a layer's `i % 2` in an unrolled scan), the
value is that branch's; otherwise it is the select, which meets the other program's select on an
equal predicate.

A branch with a collective runs on the devices that take it only: evaluated in lock step, its
collective would combine values of devices that never ran it. It is translated only where every
device takes the same branch (the same constant, or one predicate term on every device).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from equivci.hlo.ir import Computation, Instruction, Module, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.translate import elementwise
from equivci.translate.attributes import called
from equivci.translate.builder import Builder, Unsupported, Value
from equivci.translate.collectives import OPCODES as COLLECTIVES
from equivci.translate.shapes import broadcast_term

# Runs a computation on per-device argument lists (one list per parameter): the evaluator's `run`.
Runner = Callable[[Computation, list], list]

# The attributes through which an instruction calls other computations.
_CALLS = ("to_apply", "body", "condition", "calls", "true_computation", "false_computation")


def evaluate(ev: Builder, inst: Instruction, ops: list[list], run: Runner) -> list:
    """The conditional's per-device values (`ops`: per operand, its per-device values)."""
    branches = branch_computations(ev.module, inst)
    if len(ops) != len(branches) + 1:
        raise Unsupported(f"conditional {inst.name} has {len(ops) - 1} branch operands for {len(branches)} branches")
    by_predicate = "true_computation" in inst.attrs
    chosen = [_taken(ev, key, len(branches), by_predicate) for key in ops[0]]
    constant = [k for k in chosen if k is not None]
    needed = list(range(len(branches))) if len(constant) < len(chosen) else sorted(set(constant))
    uniform = len(set(chosen)) == 1 and (chosen[0] is not None or all(key is ops[0][0] for key in ops[0]))
    if not uniform and any(_has_collective(ev.module, branches[k]) for k in needed):
        raise Unsupported(
            f"conditional {inst.name} takes different branches on different devices and a branch holds a "
            "collective (which only the devices taking it would run)"
        )
    results: dict[int, list] = {}
    ev.calls.append(inst)
    try:
        for k in needed:
            results[k] = run(branches[k], [ops[k + 1]])
    except Unsupported as exc:
        raise Unsupported(f"branch {k} of conditional {inst.name}: {exc}") from exc
    finally:
        ev.calls.pop()
    out = []
    for d, taken in enumerate(chosen):
        if taken is not None:
            out.append(results[taken][d])
        else:
            values = [results[j][d] for j in range(len(branches))]
            out.append(_selected(ev, ops[0][d], values, by_predicate, inst.shape))
    return out


def branch_computations(module: Module, inst: Instruction) -> list[Computation]:
    """The branches in index order (the true branch first for a predicate)."""
    if "true_computation" in inst.attrs:
        return [called(module, inst, "true_computation"), called(module, inst, "false_computation")]
    names = [n.strip().lstrip("%") for n in inst.attrs.get("branch_computations", "").strip("{}").split(",")]
    if not all(n in module.computations for n in names):
        raise Unsupported(f"conditional {inst.name}: branch computations {names} not found in the module")
    return [module.computations[n] for n in names]


def _taken(ev: Builder, key: Term, n: int, by_predicate: bool) -> int | None:
    """The branch a constant predicate or index picks (None when it is not a constant)."""
    value = ev.folded(key)
    if value is None or value.size != 1:
        return None
    k = int(np.asarray(value).item())
    if by_predicate:
        return 0 if k else 1
    return k if 0 <= k < n else n - 1


def _selected(ev: Builder, key: Term, values: list[Value], by_predicate: bool, shape: Shape) -> Value:
    """select(p, v_0, v_1) for a predicate; select(i == 0, v_0, select(i == 1, v_1, .. v_{n-1}))
    for an index; element by element for tuples."""
    if by_predicate:
        return _select(ev, key, values[0], values[1], shape)
    acc = values[-1]
    for k in range(len(values) - 2, -1, -1):
        index = ev.const(np.asarray(k, dtype=NP_DTYPES[key.dtype]), key.dtype)
        test = elementwise.compare_terms(ev, "EQ", key, index, Shape("pred", ()))
        acc = _select(ev, test, values[k], acc, shape)
    return acc


def _select(ev: Builder, p: Term, a: Value, b: Value, shape: Shape) -> Value:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return tuple(_select(ev, p, x, y, s) for x, y, s in zip(a, b, shape.elements))
    if a is b:
        return a
    mask = broadcast_term(ev, p, Shape("pred", shape.dims), ())
    return elementwise.select_terms(ev, [mask, a, b], shape)


def _has_collective(module: Module, comp: Computation, seen: set[str] | None = None) -> bool:
    """Whether `comp`, or a computation it calls, holds a collective."""
    seen = set() if seen is None else seen
    if comp.name in seen:
        return False
    seen.add(comp.name)
    for inst in comp.instructions:
        if inst.opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVES:
            return True
        names = [inst.attrs[k] for k in _CALLS if k in inst.attrs]
        names += inst.attrs.get("branch_computations", "").strip("{}").split(",")
        for name in (n.strip().lstrip("%") for n in names):
            if name in module.computations and _has_collective(module, module.computations[name], seen):
                return True
    return False
