"""Translate an HLO module into terms over the reference inputs, one copy per device.

The per-device (SPMD) program is evaluated for every device in lock step, so collectives become
plain terms over the other devices' values (all-reduce: a sum in group order, all-gather: a
concatenation, collective-permute: the source device's value). Everything that depends only on
the device index (partition-id arithmetic, dynamic-slice offsets) is folded to constants here,
which turns `dynamic_slice(w, axis_index * k)` into a static slice of the reference input.
Ops without a model become `opaque` terms: equal only to the same op on equal arguments.

This module is the driver: it walks the instructions and hands each to the handler of its opcode
(`HANDLERS`, one module per op family: literals, elementwise, shapes, reductions, sorts, collectives);
the handlers build terms through the `Builder` the evaluator is. Calls are evaluated inline,
conditionals as their branches (conditionals.py), and loops by the loop handler a caller installs
(prove/loops.py, translate/unroll.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

from equivci.hlo.ir import Computation, Instruction, Module, Shape
from equivci.options import Budgets
from equivci.terms.ir import Term, TermTable
from equivci.translate import (
    bounds,
    collectives,
    complex_pairs,
    conditionals,
    convolutions,
    elementwise,
    factored_dots,
    group_ids,
    literals,
    quotients,
    reciprocals,
    reductions,
    regroup,
    row_tables,
    scaled_dots,
    shapes,
    sorts,
)
from equivci.translate.attributes import called
from equivci.translate.builder import Builder, Unsupported, Value
from equivci.translate.opaque import opaque

# The handler of an opcode: (builder, instruction, one device's operands, device index) -> its value there.
Handler = Callable[[Builder, Instruction, list, int], Value]
HANDLERS: dict[str, Handler] = {
    **literals.HANDLERS,
    **elementwise.HANDLERS,
    **shapes.HANDLERS,
    **reductions.HANDLERS,
    **quotients.HANDLERS,  # a dot of a quotient, also as the quotient of the dot
    **sorts.HANDLERS,
    **group_ids.HANDLERS,
    **convolutions.HANDLERS,
}


@dataclasses.dataclass
class Event:
    """One evaluated instruction, kept in program order for localization."""

    inst: Instruction
    values: list  # per device: Term or tuple of Terms


@dataclasses.dataclass
class Loop:
    """One evaluated `while`: its state before the first iteration and after the last, per device."""

    inst: Instruction
    init: list  # per device: tuple of Terms
    out: list  # per device: tuple of Terms


class LoopHandler(Protocol):
    def evaluate(self, evaluator: "Evaluator", inst: Instruction, init: list) -> list | None:
        """The per-device results of a `while`, or None to leave it opaque."""


class Evaluator(Builder):
    def __init__(self, module: Module, table: TermTable, num_devices: int, budgets: Budgets = Budgets()):
        super().__init__(module, table, num_devices, budgets)
        self.events: list[Event] = []
        self.loops: list[Loop] = []
        self.loop_handler: LoopHandler | None = None
        # (term, target) pairs a proof must also show equal: what a loop handler assumed.
        self.obligations: list[tuple[Term, Term]] = []
        self.entry_args: list[list] | None = None  # per-device entry arguments, for re-runs
        self.collectives = collectives.Collectives()

    def elementwise(self, kind: str, attrs: tuple, args: list[Term], shape: Shape) -> Term:
        if len(attrs) != 1:
            return super().elementwise(kind, attrs, args, shape)
        terms = elementwise.binary_terms if kind == "binary" else elementwise.unary_terms
        return terms(self, attrs[0], args, shape)

    def child(self, module: Module, num_devices: int) -> "Evaluator":
        """An evaluator with its own events that shares what is known about constants."""
        sub = Evaluator(module, self.table, num_devices, self.budgets)
        sub.values, sub.constants, sub.equal_terms = self.values, self.constants, self.equal_terms
        return sub

    def variant(
        self, pairs_override: dict[str, list[tuple[int, int]]], loop_handler: LoopHandler | None = None
    ) -> list[list[Term]]:
        """The per-device entry results with some collective-permutes' pairs replaced; `while` ops
        go to `loop_handler` (none: opaque).

        The same term table and constants are shared, so unchanged parts give the same terms. The
        terms stated equal while evaluating (`equal_terms`) are appended to this evaluator's.
        """
        other = Evaluator(self.module, self.table, self.n, self.budgets)
        other.values, other.constants, other.bounds = self.values, self.constants, self.bounds
        other.equal_terms = self.equal_terms
        other.loop_handler = loop_handler
        other.collectives = collectives.Collectives(pairs_override)
        assert self.entry_args is not None, "variant() of an evaluator that has not run"
        return other.run(self.module.entry, self.entry_args)

    def run(self, comp: Computation, args: list[list]) -> list:
        """Evaluate `comp` on per-device argument lists; returns the per-device root values."""
        env: dict[str, list] = {}
        if comp is self.module.entry:
            self.entry_args = args
        params = {int(p.attrs["_number"]): p.name for p in comp.parameters()}
        for k, name in params.items():
            env[name] = args[k]
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                continue
            operands = [_lookup(env, o) for o in inst.operands]
            env[inst.name] = self.eval(inst, operands)
            self.events.append(Event(inst, env[inst.name]))
        return env[comp.root.name]

    def eval(self, inst: Instruction, ops: list[list]) -> list:
        op = inst.opcode
        if op in collectives.OPCODES:
            return collectives.evaluate(self, self.collectives, inst, ops)
        if op == "call":
            self.calls.append(inst)
            try:
                return self.run(called(self.module, inst, "to_apply"), ops)
            finally:
                self.calls.pop()
        if op == "while":
            return self.loop(inst, ops[0])
        if op == "conditional":
            return conditionals.evaluate(self, inst, ops, self.run)
        if (kept := elementwise.plus_zero(self, inst, ops)) is not None:
            return kept
        return [self.local(inst, [o[d] for o in ops], d) for d in range(self.n)]

    def loop(self, inst: Instruction, init: list) -> list:
        out = self.loop_handler.evaluate(self, inst, init) if self.loop_handler is not None else None
        if out is None:
            out = [opaque(self, inst, [init[d]]) for d in range(self.n)]
        self.loops.append(Loop(inst, init, out))
        return out

    def local(self, inst: Instruction, args: list, device: int):
        handler = HANDLERS.get(inst.opcode)
        handler = handler if handler is not None else _opaque
        result = complex_pairs.evaluate(self, inst, args, device, HANDLERS)  # complex values as real pairs
        if result is None:
            result = handler(self, inst, args, device)
        bounds.note(self, inst, args, result)
        regroup.note(self, inst, args, result, handler, device)
        row_tables.note(self, inst, args, result, handler, device)
        scaled_dots.note(self, inst, args, result, handler, device)
        factored_dots.note(self, inst, args, result)
        reciprocals.note(self, result)
        return result


def _opaque(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    return opaque(ev, inst, args)


def _lookup(env: dict[str, list], name: str) -> list:
    """Operand values; newer XLA prints tuple elements as `name#k` instead of get-tuple-element."""
    if name in env:
        return env[name]
    base, sep, index = name.rpartition("#")
    if not sep or base not in env:
        raise Unsupported(f"operand {name} is not defined before its use")
    return [v[int(index)] for v in env[base]]
