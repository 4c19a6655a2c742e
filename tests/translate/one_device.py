"""Both programs of a test as one jitted function on one device: translate facts checked against
what XLA computes for the same HLO."""

from __future__ import annotations

import jax
import numpy as np

from equivci.capture.types import LeafPlacement
from equivci.hlo.ir import Module
from equivci.hlo.parser import parse_module
from equivci.prove.programs import build_programs
from equivci.terms.ir import Term, TermTable
from equivci.translate.evaluator import Evaluator
from equivci.translate.programs import Programs


def leaf(path: str, value) -> LeafPlacement:
    """The placement of a whole value on the one device."""
    value = np.asarray(value)
    return LeafPlacement(path, value.shape, str(value.dtype), (tuple((0, n) for n in value.shape),))


def programs(fn, args) -> tuple[Programs, np.ndarray, Module]:
    """fn's HLO built as both programs, what XLA computes for args, and the parsed module."""
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo", debug_info=True))
    want = np.asarray(jax.jit(fn)(*args))
    inputs = tuple(leaf(f"[{k}]", a) for k, a in enumerate(args))
    return build_programs(module, module, inputs, (leaf("[0]", want),), 1), want, module


def evaluated(fn, args) -> tuple[Evaluator, dict[int, np.ndarray]]:
    """The evaluator run over fn's program on one device, its inputs as parameters (the facts it
    states are in `ev.equal_terms`), and the input values by parameter number."""
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    params = [
        ev.table.make("param", (k,), (), np.shape(a), module.entry.parameters()[k].shape.dtype)
        for k, a in enumerate(args)
    ]
    ev.run(module.entry, [[p] for p in params])
    return ev, {k: np.asarray(a) for k, a in enumerate(args)}


def op_names(t: Term) -> set[str]:
    """The ops a term is built of, its own and every operand's."""
    seen, stack = set(), [t]
    while stack:
        u = stack.pop()
        seen.add(u.op)
        stack.extend(u.args)
    return seen
