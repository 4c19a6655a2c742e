"""Loops whose trip count is a constant, unrolled into straight-line terms.

A `while` whose condition is a constant on every iteration (a counter initialised, stepped and
compared with constants, as lax.scan and fori_loop with static bounds lower) runs the same number
of iterations on every input, and its result is the body applied that many times to the initial
state. Evaluating the body once per iteration gives terms in which the loop counter is a constant,
so dynamic slices and updates at the counter become plain windows and selects on it fold: the rest
of the verifier then relates them like straight-line code (a microbatch accumulation is a sum over
windows of the batch, a pipeline schedule a composition of its stages).

The trip count is found first, cheaply and exactly: only the body instructions the condition's
state elements depend on are evaluated, until the condition is false. A condition that is not a
constant (it depends on an input), or that differs between devices, leaves the loop alone.
The cost is bounded: at most MAX_TRIPS iterations and MAX_UNROLLED body instructions in all.
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Computation, Instruction
from equivci.translate.attributes import called
from equivci.translate.evaluator import Evaluator, _lookup

MAX_TRIPS = 32
MAX_UNROLLED = 20_000  # body instructions evaluated over all iterations of one loop


class Unroller:
    """A loop handler that unrolls every loop it can (the reference program's)."""

    def evaluate(self, evaluator: Evaluator, inst: Instruction, init: list) -> list | None:
        return unroll(evaluator, inst, init)


def unroll(ev: Evaluator, inst: Instruction, init: list) -> list | None:
    """The loop's per-device results as the body applied trip-count times, or None."""
    body = called(ev.module, inst, "body")
    trips = trip_count(ev, inst, init)
    if trips is None or trips * len(body.instructions) > MAX_UNROLLED:
        return None
    state = init
    for _ in range(trips):
        state = ev.run(body, [state])
    return state


def trip_count(ev: Evaluator, inst: Instruction, init: list) -> int | None:
    """How many times the body runs, when the condition is the same constant on every device at
    every iteration; None otherwise (or past MAX_TRIPS)."""
    cond, body = called(ev.module, inst, "condition"), called(ev.module, inst, "body")
    if not all(isinstance(v, tuple) for v in init) or body.root.opcode != "tuple":
        return None
    needed = _counter_slice(cond, body)
    if needed is None:
        return None
    indices, names = needed
    scratch = ev.child(ev.module, ev.n)  # its events are dropped; folded values are shared
    scratch.bounds = ev.bounds
    state = init
    for trips in range(MAX_TRIPS + 1):
        go = _flag(scratch, scratch.run(cond, [state]))
        if go is None:
            return None
        if not go:
            return trips
        env: dict[str, list] = {body.parameters()[0].name: state}
        for step in body.instructions:
            if step.name in names and step.opcode != "parameter":
                env[step.name] = scratch.eval(step, [_lookup(env, o) for o in step.operands])
        new = [_lookup(env, body.root.operands[k]) for k in indices]
        state = [
            tuple(new[indices.index(k)][dev] if k in indices else old for k, old in enumerate(state[dev]))
            for dev in range(ev.n)
        ]
    return None


def _flag(ev: Evaluator, values: list) -> bool | None:
    """The condition's value when it is one constant on every device."""
    flags = [ev.folded(v) if not isinstance(v, tuple) else None for v in values]
    if any(f is None or np.size(f) != 1 for f in flags):
        return None
    found = {bool(np.asarray(f).item()) for f in flags}  # type: ignore[union-attr]
    return found.pop() if len(found) == 1 else None


def _counter_slice(cond: Computation, body: Computation) -> tuple[list[int], set[str]] | None:
    """The state elements the condition depends on, closed under the body's dependencies, and the
    body instructions that compute them (None when an element is read other than one by one)."""
    indices = _reads(cond)
    if indices is None:
        return None
    producers = {i.name: i for i in body.instructions}
    while True:
        names: set[str] = set()
        stack = [body.root.operands[k] for k in indices]
        while stack:
            name = stack.pop().partition("#")[0]
            if name in names or name not in producers:
                continue
            names.add(name)
            stack.extend(producers[name].operands)
        reads = _reads(body, names)
        if reads is None:
            return None
        if reads <= set(indices):
            return sorted(indices), names
        indices = sorted(set(indices) | reads)


def _reads(comp: Computation, within: set[str] | None = None) -> set[int] | None:
    """Indices of the state tuple (the computation's parameter) read by `within`'s instructions."""
    param = comp.parameters()[0].name
    out: set[int] = set()
    for inst in comp.instructions:
        if within is not None and inst.name not in within:
            continue
        for operand in inst.operands:
            base, sep, index = operand.partition("#")
            if base != param:
                continue
            if sep:
                out.add(int(index))
            elif inst.opcode == "get-tuple-element":
                out.add(int(inst.attrs["index"]))
            else:
                return None
    return out
