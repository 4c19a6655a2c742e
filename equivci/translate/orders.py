"""An argmax of a strictly increasing map of each lane is the argmax of the lane itself.

    argmax(f(x), axis) = argmax(x, axis)    (and argmin, and any reducer that only orders)

holds over the reals for every f that is strictly increasing and the same along the reduced dims:
it keeps which elements are larger and which are equal, all such a reducer reads of the values
(the index operand is not mapped). f is a chain of `exp`, `tanh`, `logistic`, `+ m` and `- m` with
m constant along the reduced dims, `* m` and `/ m` with m positive there (a positive constant, or
a sum of exponentials): softmax's `exp(x - max) / sum`. A router's `argmax(softmax(logits))` then
meets `argmax(logits)`. The reducer's initial value is not mapped: it must be infinite, so that a
finite element compares with it alike before and after f. (In floats f can round two elements to
one value, where argmax takes the first: over the reals it cannot.)

A sort comparator is read the same way, on scalars: `sort_direction` finds whether it orders by
the first operand alone, ascending or descending, over the reals (jnp.sort's NaN- and
zero-canonicalizing total-order `<` is a plain ascending order there).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from equivci.hlo.ir import Computation, Instruction, Module
from equivci.terms.ir import Term
from equivci.terms.spec import BcastSpec
from equivci.translate.builder import Builder

# opcodes of a reducer that reads its values only through comparisons and passes them on unchanged
ORDERING = {"parameter", "compare", "select", "and", "or", "not", "tuple"}
INCREASING = {"exponential", "tanh", "logistic"}


def orders_only(module: Module, computation: str) -> bool:
    """Whether the reducer's result depends on its values only through how they compare."""
    return all(inst.opcode in ORDERING for inst in module.computations[computation].instructions)


def is_argmax(module: Module, computation: str) -> bool:
    """Whether an ordering reducer of (value, index) pairs keeps the pair with the larger value,
    either pair on a tie: its result depends only on how the values and the indices compare, so
    the nine orderings of two pairs decide it for every real input."""
    comp = module.computations[computation]
    for a, b in ((0.0, 1.0), (1.0, 0.0), (1.0, 1.0)):
        for i, j in ((0, 1), (1, 0), (0, 0)):
            out = _run(comp, [a, i, b, j])
            if out is None or len(out) != 2:
                return False
            value, index = out
            if value != max(a, b) or index not in ([i] if a > b else [j] if b > a else [i, j]):
                return False
    return True


def first_on_ties(module: Module, computation: str) -> bool:
    """Whether an argmax reducer (`is_argmax`) keeps the smaller index of two pairs with one value,
    in either order: jnp.argmax's, whose result is then the first position of the lane's largest
    value whatever order XLA reduces in."""
    comp = module.computations[computation]
    return all((out := _run(comp, [1.0, i, 1.0, j])) is not None and out[1] == min(i, j) for i, j in ((0, 1), (1, 0)))


def _run(comp: Computation, params: list) -> list | None:
    """The reducer's result on scalars (its ops are those of ORDERING), None if it reads something else."""
    result = _evaluate(comp, params)
    return result if isinstance(result, list) else None


def _evaluate(comp: Computation, params: list) -> object:
    """The computation's root on scalars, None if it runs an op other than those of ORDERING and
    scalar constants, or compares a NaN (outside the reals this module reasons over). A compare
    with `order=TOTAL` ranks -0.0 below 0.0, as XLA's total order does."""
    env: dict[str, object] = {}
    for inst in comp.instructions:
        ops = [env.get(o) for o in inst.operands]
        if inst.opcode == "parameter":
            env[inst.name] = params[int(inst.attrs["_number"])]
        elif inst.opcode == "constant" and (value := _scalar(inst)) is not None:
            env[inst.name] = value
        elif inst.opcode == "compare" and inst.attrs.get("direction") in COMPARE:
            if any(isinstance(v, float) and math.isnan(v) for v in ops):
                return None
            total = inst.attrs.get("order") == "TOTAL" or inst.attrs.get("type") == "TOTALORDER"
            try:
                env[inst.name] = COMPARE[inst.attrs["direction"]](*(_total_key(v) if total else v for v in ops))
            except TypeError:  # values of two kinds (a tuple key against a boolean): no model
                return None
        elif inst.opcode == "select":
            env[inst.name] = ops[1] if ops[0] else ops[2]
        elif inst.opcode in ("and", "or"):
            env[inst.name] = (ops[0] and ops[1]) if inst.opcode == "and" else (ops[0] or ops[1])
        elif inst.opcode == "not":
            env[inst.name] = not ops[0]
        elif inst.opcode == "tuple":
            env[inst.name] = list(ops)
        else:
            return None
    return env.get(comp.root.name)


COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "EQ": operator.eq,
    "NE": operator.ne,
    "LT": operator.lt,
    "LE": operator.le,
    "GT": operator.gt,
    "GE": operator.ge,
}


def _scalar(inst: Instruction) -> float | bool | None:
    """A scalar constant's value (a float, also for integers: they compare alike), None otherwise."""
    text = inst.attrs.get("_literal", "").strip()
    if inst.shape.is_tuple or inst.shape.dims:
        return None
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text)
    except ValueError:
        return None


def _total_key(v: object) -> object:
    """v's place in XLA's total order of floats (-0.0 before 0.0); other values as they are."""
    return (v, math.copysign(1.0, v) > 0) if isinstance(v, float) else v


def sort_direction(module: Module, computation: str, operands: int, dtype: str) -> str | None:
    """LT (GT) when the comparator of a sort of `operands` operands is `key0 < key1` (`key0 > key1`)
    for every pair of real keys of `dtype`, whatever the other operands hold: an ascending
    (descending) sort by the first operand, the order terms/semantics.sort_lanes sorts by (-0.0 and
    0.0 one key). jnp.sort's comparator, which maps -0.0 to 0.0 and a NaN to one NaN before a
    total-order `<`, is LT; a bare total-order `<` is none (it ranks -0.0 first).

    The comparator reads values only through compares (ORDERING ops and scalar constants), so its
    result depends only on how the two keys lie among the constants and each other: keys drawn from
    the constants, both zeros, the infinities and two points inside each interval the constants cut
    the line into (for integer keys, integer points; for booleans, both) meet every such ordering,
    and the other operands are drawn in each of their three orderings. NaN is not drawn: the facts
    built on this order hold over the reals."""
    comp = module.computations[computation]
    keys = _key_points(comp, dtype)
    for direction in ("LT", "GT"):
        if all(
            _evaluate(comp, [a, b, *(list(rest) * (operands - 1))]) == COMPARE[direction](a, b)
            for a in keys
            for b in keys
            for rest in ((0, 1), (1, 0), (0, 0))
        ):
            return direction
    return None


def _key_points(comp: Computation, dtype: str) -> list:
    """The keys sort_direction draws (its docstring)."""
    if dtype == "pred":
        return [False, True]
    found = {v for i in comp.instructions if i.opcode == "constant" and isinstance(v := _scalar(i), float)}
    cuts = sorted({float(v) for v in found if math.isfinite(v)} | {0.0})
    if dtype[0] in "su":
        return sorted({float(c + d) for c in cuts for d in (-2, -1, 0, 1, 2)})
    inside = [c + (d - c) * t for c, d in zip(cuts, cuts[1:]) for t in (1 / 3, 2 / 3)]
    ends = [cuts[0] - 2, cuts[0] - 1, cuts[-1] + 1, cuts[-1] + 2, -math.inf, math.inf, -0.0]
    return [*cuts, *inside, *ends]


def increasing_chain(ev: Builder, x: Term, reduced: tuple[int, ...]) -> list[Term]:
    """x, then each operand a strictly increasing step along the reduced dims was applied to."""
    chain = [x]
    while (inner := _increasing_operand(ev, chain[-1], reduced)) is not None:
        chain.append(inner)
    return chain


def unmapped(ev: Builder, x: Term, reduced: tuple[int, ...], init: np.ndarray) -> Term | None:
    """x without its strictly increasing map along the reduced dims (module docstring), or None
    when there is none to take off or the reducer's initial value is finite."""
    if np.isfinite(init).all():
        return None
    base = increasing_chain(ev, x, reduced)[-1]
    return None if base is x else base


def _increasing_operand(ev: Builder, t: Term, reduced: tuple[int, ...]) -> Term | None:
    """a when t = f(a) for one strictly increasing step f, the same along the reduced dims."""
    if t.op == "unary" and t.attrs[0] in INCREASING:
        return t.args[0]
    if t.op != "binary" or t.attrs[0] not in ("add", "subtract", "multiply", "divide"):
        return None
    op, (a, b) = t.attrs[0], t.args
    if op in ("add", "multiply") and _lane_constant(a, reduced) and not _lane_constant(b, reduced):
        a, b = b, a  # m + a, m * a
    if a.shape != t.shape or not _lane_constant(b, reduced):
        return None
    if op in ("add", "subtract") or _positive(ev, b):
        return a
    return None


def _lane_constant(t: Term, reduced: tuple[int, ...]) -> bool:
    """Whether t is a broadcast along every reduced dim (one value per lane)."""
    if t.op != "bcast":
        return False
    parts = BcastSpec.parse(t.attrs[0]).parts
    return all(parts[d][0] == "n" for d in reduced)


def _positive(ev: Builder, spread: Term) -> bool:
    """Whether every element of the broadcast's operand is > 0 over the reals: a positive constant,
    or a sum of exponentials (through reshapes)."""
    (m,) = spread.args
    value = ev.folded(m)
    if value is not None:
        return bool(value.size) and bool(np.all(value > 0))
    while m.op == "reshape":
        m = m.args[0]
    return m.op == "reduce" and m.attrs[0] == "add" and m.args[0].op == "unary" and m.args[0].attrs[0] == "exponential"
