"""An exponential of a value less the log of a positive sum as the quotient by that sum.

Over the reals, exp(u - log s) = exp(u) / s for every s > 0. Softmax is written both ways: the
reference's `jax.nn.softmax(x)` divides, exp(x - m) / Σ exp(x - m), and a vocabulary-parallel
device, which has the log-partition lse = m + log psum(Σ exp(x - m)) at hand, takes
exp(x - lse) = exp((x - m) - log s). The entropy's expected logit Σ p · x (or a distillation's
Σ p_teacher · log p_student) then meets the reference's, shard by shard: the quotient is a window
of the reference's softmax, and the devices' sums of its products merge.

Only for s that is positive by how it is made: an exponential, a constant above zero, and sums,
products, maxima, absolute values and layouts (broadcasts, reshapes, windows, concatenations) of
positive values (an all-reduce's sum is a sum). For s <= 0 log s is NaN or -inf while exp(u) / s
is a number, so no other s is read. The roundings differ by a few ulps, as a sum's order does,
which the contract leaves free.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Protocol

from equivci.hlo.ir import FLOATS, Shape
from equivci.terms.ir import Term
from equivci.translate import signed_sums

LAYOUTS = ("bcast", "reshape", "slice", "transpose", "concat")
# ops whose value is positive where all their operands are (a maximum: where either is)
POSITIVE_OF_POSITIVE = (("add",), ("multiply",), ("divide",), ("maximum",))


class Builder(signed_sums.Builder, Protocol):
    """What the quotient needs of the builder (equivci.translate.builder.Builder)."""

    def uniform(self, t: Term) -> Fraction | None: ...


def exp_quotient(
    ev: Builder,
    arg: Term,
    shape: Shape,
    exp: Callable[[Term, Shape], Term],
    binary: Callable[[str, list[Term], Shape], Term],
) -> Term | None:
    """exp(arg) as exp(u) / s where `arg` is the signed sum u - log s (under broadcasts and reshapes
    of the log) with s positive; `exp` and `binary` build those ops in normal form. None when no atom
    of arg is the log of a positive value subtracted once, or more than one is."""
    found = signed_sums.atoms(ev, arg)
    if found is None or len(found) < 2:
        return None
    logs = [(k, s) for k, (c, a) in enumerate(found) if c == -1 and (s := _log_argument(ev, a)) is not None]
    if len(logs) != 1:
        return None
    ((log_at, denominator),) = logs
    u = _written(ev, [pair for k, pair in enumerate(found) if k != log_at], Shape(arg.dtype, arg.shape), binary)
    if u is None:
        return None
    return binary("divide", [exp(u, shape), denominator], shape)


def _log_argument(ev: Builder, atom: Term) -> Term | None:
    """s laid out as `atom`, where atom is log(s) under broadcasts and reshapes and s is positive."""
    layout = []
    t = atom
    while t.op in ("bcast", "reshape"):
        layout.append(t)
        t = t.args[0]
    if t.op != "unary" or t.attrs != ("log",) or not positive(ev, t.args[0]):
        return None
    s = t.args[0]
    for outer in reversed(layout):
        laid = Shape(outer.dtype, outer.shape)
        s = ev.reshape_term(s, laid) if outer.op == "reshape" else ev.mk("bcast", outer.attrs, [s], laid)
    return s


def positive(ev: Builder, t: Term) -> bool:
    """Whether every element of `t` is above zero over the reals, by how it is made."""
    if t.dtype not in FLOATS:
        return False
    number = ev.uniform(t)
    if number is not None:
        return number > 0
    factor, base = ev.scale_of(t)
    if factor != 1:
        return factor > 0 and positive(ev, base)
    if t.op == "unary":
        return t.attrs == ("exponential",) or (t.attrs == ("abs",) and positive(ev, t.args[0]))
    if t.op == "binary" and t.attrs in POSITIVE_OF_POSITIVE:
        return all(positive(ev, a) for a in t.args)
    if t.op == "reduce":
        return t.attrs[0] in ("add", "maximum") and all(n > 0 for n in t.args[0].shape) and positive(ev, t.args[0])
    return t.op in LAYOUTS and all(positive(ev, a) for a in t.args)


def _written(
    ev: Builder, atoms: list[tuple[Fraction, Term]], shape: Shape, binary: Callable[[str, list[Term], Shape], Term]
) -> Term | None:
    """The atoms added up in their written order (the first one negated if its coefficient is), so
    that its signed sum in one form is stated beside it as for any written difference."""
    first = ev.scaled(atoms[0][1], abs(atoms[0][0]))
    if first is None:
        return None
    acc = first if atoms[0][0] > 0 else ev.normal("unary", ("negate",), [first], shape)
    for c, atom in atoms[1:]:
        part = ev.scaled(atom, abs(c))
        if part is None:
            return None
        acc = binary("add" if c > 0 else "subtract", [acc, part], shape)
    return acc
