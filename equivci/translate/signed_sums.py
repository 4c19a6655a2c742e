"""Sums of signed terms in one form.

Over the reals, a float value built by additions, subtractions, negations, constant factors and
reshapes is the linear combination Σ c_i · a_i of the terms it adds up (its atoms): its value does
not depend on the order or the grouping. A cross-entropy written `lse - target` on a vocabulary
shard, with `lse = log(sum_exp) + m`, and the reference's `-((target - m) - log(sum_exp))`
(log-softmax picked) add up the same atoms with the same coefficients, but the saturation's
regrouping rules only join sums that both exist already. `one_form` builds the combination in one
order (atoms sorted by their op and coefficient), which the translator states equal
to the written term: two programs that add up the same atoms, or atoms the proof shows equal at
the same place of that order, meet there. An all-reduce's sum of the devices' values is one atom:
it stands for one value of the reference (the target's logit summed over the vocabulary shards),
not for its pieces.

A broadcast of a sum is the sum of the broadcasts, exactly (a broadcast copies): log-softmax on a
vocabulary shard, `x - (m + log_sum)` with one broadcast of the keepdims sum, adds up the atoms of
the reference's `(x - m) - log_sum`. A sum over dims of a signed sum whose atoms include broadcasts
along those dims is spread over its atoms (Σ_R (x - bcast(y)) = Σ_R x - |R| · y: label smoothing's mean log-probability). Every
written term stays an atom of its own: x - x is kept (it is not 0 where x is infinite).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Protocol

from equivci.hlo.ir import FLOATS, Shape
from equivci.options import Budgets
from equivci.terms.ir import Term
from equivci.terms.spec import BcastSpec, ReduceSpec

LINEAR = (("add",), ("subtract",))


class Builder(Protocol):
    """What the form needs of the builder (equivci.translate.builder.Builder)."""

    budgets: Budgets
    collective_sums: set[Term]
    regrouped_sums: dict[Term, Term]

    def inputs_of(self, t: Term) -> tuple[int, ...]: ...

    def folded(self, term: Term): ...

    def scale_of(self, t: Term) -> tuple[Fraction, Term]: ...

    def scaled(self, base: Term, factor: Fraction) -> Term | None: ...

    def mk(self, op: str, attrs: tuple, args, shape: Shape) -> Term: ...

    def reshape_term(self, operand: Term, shape: Shape) -> Term: ...

    def normal(self, kind: str, attrs: tuple, args, shape: Shape) -> Term: ...


def one_form(ev: Builder, term: Term) -> Term | None:
    """The sum `term` adds up in one order, when it has a subtracted term (a difference or a
    negation, with its factors) and at most `budgets.signed_terms` atoms; None otherwise, or when it
    is that form already."""
    if term.dtype not in FLOATS or ev.folded(term) is not None:
        return None
    atoms: list[tuple[Fraction, Term]] = []
    shape = Shape(term.dtype, term.shape)
    if not _collect(ev, term, Fraction(1), atoms, shape, ev.budgets.signed_terms) or len(atoms) < 2:
        return None
    if all(c > 0 for c, _ in atoms):
        return None  # a plain sum: the regrouping rules' business
    # sorted by what the atom is and its coefficient, not by where it was written; ties keep the
    # written order
    ordered = sorted(atoms, key=lambda item: (_key(item[1]), item[0]))
    form = _signed(ev, ordered[0][1], ordered[0][0], shape)
    for c, atom in ordered[1:]:
        part = _signed(ev, atom, abs(c), shape)
        if form is None or part is None:
            return None
        form = ev.mk("binary", ("add",) if c > 0 else ("subtract",), [form, part], shape)
    return None if form is None or form is term else form


def atoms(ev: Builder, term: Term) -> list[tuple[Fraction, Term]] | None:
    """The (coefficient, atom) pairs of the float sum `term` adds up, in written order (at most
    `budgets.signed_terms` atoms); None past that, or for a term of another dtype."""
    found: list[tuple[Fraction, Term]] = []
    if term.dtype not in FLOATS or not _collect(
        ev, term, Fraction(1), found, Shape(term.dtype, term.shape), ev.budgets.signed_terms
    ):
        return None
    return found


def mixed_signs(ev: Builder, term: Term) -> bool:
    """Whether `term` adds up atoms of both signs (at most `budgets.signed_terms` of them): a
    difference, not a plain sum or a negated one."""
    atoms: list[tuple[Fraction, Term]] = []
    if term.dtype not in FLOATS or not _collect(
        ev, term, Fraction(1), atoms, Shape(term.dtype, term.shape), ev.budgets.signed_terms
    ):
        return False
    return any(c > 0 for c, _ in atoms) and any(c < 0 for c, _ in atoms)


def plain_form(ev: Builder, term: Term) -> Term | None:
    """A sum of at least three terms, none subtracted, in one order: its atoms sorted by the
    reference inputs they read (Builder.inputs_of; ties keep the written order), an all-reduce of
    the devices' sums read as the sum of its terms' all-reduces (psum is linear:
    psum(a + m) = psum(a) + psum(m)). A parallel residual block's `x + psum(attn + mlp) + b1 + b2`
    and the reference's `x + (attn + b1) + (mlp + b2)` read the same inputs in each term: their
    forms meet term by term, where the regrouping rules join only groupings that exist already.
    None for other terms, or when the written sum is that form already."""
    if term.dtype not in FLOATS or ev.folded(term) is not None or term.op != "binary" or term.attrs != ("add",):
        return None
    atoms: list[tuple[Fraction, Term]] = []
    shape = Shape(term.dtype, term.shape)
    if not _collect(ev, term, Fraction(1), atoms, shape, ev.budgets.signed_terms, regrouped=True) or len(atoms) < 3:
        return None
    if any(c <= 0 for c, _ in atoms):
        return None  # a signed sum: one_form's
    ordered = sorted(atoms, key=lambda item: ev.inputs_of(item[1]))
    form = _signed(ev, ordered[0][1], ordered[0][0], shape)
    for c, atom in ordered[1:]:
        part = _signed(ev, atom, c, shape)
        if form is None or part is None:
            return None
        form = ev.mk("binary", ("add",), [form, part], shape)
    return None if form is None or form is term else form


def _collect(
    ev: Builder,
    t: Term,
    c: Fraction,
    out: list[tuple[Fraction, Term]],
    shape: Shape,
    limit: int,
    regrouped: bool = False,
    reserved: int = 0,
) -> bool:
    """Appends t's atoms times c, reshaped to `shape`, to out (a reshape of a sum is the sum of the
    reshapes: keepdims' `log(s) + m` of shape [b, 1], squeezed); False past `limit` atoms.
    `regrouped`: an all-reduce of the devices' sums adds up its terms' all-reduces. `reserved`: the
    atoms the terms still to walk after t add at least (one each: every walk appends one), so that a
    sum past the limit is given up before its walk goes down: the residual stream `x + f(x)` of
    every earlier layer is a left-deep sum, and walking it to its first term at every layer costs a
    time quadratic in the depth."""
    if len(out) + 1 + reserved > limit:
        return False
    factor, base = ev.scale_of(t)
    c *= factor
    if regrouped and base in ev.regrouped_sums:
        return _collect(ev, ev.regrouped_sums[base], c, out, shape, limit, regrouped, reserved)
    linear = base.op == "binary" and base.attrs in LINEAR and all(a.shape == base.shape for a in base.args)
    if base not in ev.collective_sums and linear:  # an all-reduce's sum is one value (the reference's)
        first, second = base.args
        sign = 1 if base.attrs == ("add",) else -1
        return _collect_all(ev, [(c, first), (c * sign, second)], out, shape, limit, regrouped, reserved)
    if base.op == "unary" and base.attrs == ("negate",):
        return _collect(ev, base.args[0], -c, out, shape, limit, regrouped, reserved)
    if (product := _unnegated_product(ev, base)) is not None:  # (-a) * b = -(a * b), exactly
        return _collect(ev, product, -c, out, shape, limit, regrouped, reserved)
    if (broadcast := _broadcast_terms(ev, base)) is not None:
        return _collect_all(ev, [(c * k, a) for k, a in broadcast], out, shape, limit, regrouped, reserved)
    if base.op == "reshape":
        return _collect(ev, base.args[0], c, out, shape, limit, regrouped, reserved)
    if (spread := _spread_sum(ev, base, limit)) is not None:
        return _collect_all(ev, [(c * k, a) for k, a in spread], out, shape, limit, regrouped, reserved)
    out.append((c, base if base.shape == shape.dims else ev.reshape_term(base, shape)))
    return len(out) <= limit


def _collect_all(
    ev: Builder,
    terms: list[tuple[Fraction, Term]],
    out: list[tuple[Fraction, Term]],
    shape: Shape,
    limit: int,
    regrouped: bool,
    reserved: int,
) -> bool:
    """_collect of each (coefficient, term) in order, each walk reserving an atom for every term after it."""
    return all(
        _collect(ev, a, k, out, shape, limit, regrouped, reserved + len(terms) - 1 - i)
        for i, (k, a) in enumerate(terms)
    )


def _unnegated_product(ev: Builder, t: Term) -> Term | None:
    """a * b for t = (-a) * b or a * (-b): negating an operand negates a product exactly (the sign
    bit), so the negation is a coefficient of the sum t is a term of. None for any other term."""
    if t.op != "binary" or t.attrs != ("multiply",):
        return None
    for k, arg in enumerate(t.args):
        if arg.op == "unary" and arg.attrs == ("negate",) and arg.shape == t.shape:
            args = list(t.args)
            args[k] = arg.args[0]
            return ev.normal("binary", ("multiply",), args, Shape(t.dtype, t.shape))
    return None


def _broadcast_terms(ev: Builder, t: Term) -> list[tuple[int, Term]] | None:
    """A broadcast of a sum (or difference) as the sum of the broadcasts: two biases added before
    XLA broadcasts them once, bcast(b1 + b2) = bcast(b1) + bcast(b2). None for any other term."""
    if t.op != "bcast" or (inner := t.args[0]).op != "binary" or inner.attrs not in LINEAR:
        return None
    if inner in ev.collective_sums or any(a.shape != inner.shape for a in inner.args):
        return None
    out = Shape(t.dtype, t.shape)
    first, second = (ev.normal("bcast", t.attrs, [a], out) for a in inner.args)
    return [(1, first), (1 if inner.attrs == ("add",) else -1, second)]


def _spread_sum(ev: Builder, t: Term, limit: int) -> list[tuple[Fraction, Term]] | None:
    """A float sum over dims R of a signed sum some of whose atoms are broadcasts along exactly R, as
    the signed sum of the atoms' sums: Σ_R (x - bcast(y)) = Σ_R x - |R| · y (the mean of
    log-probabilities, Σ (logits - lse) / V, is Σ logits / V - lse). None for any other term."""
    if t.op != "reduce" or t.attrs[0] != "add" or t.dtype not in FLOATS or len(t.args) != 1:
        return None
    (operand,) = t.args
    reduced = ReduceSpec.parse(t.attrs[1]).dims
    atoms: list[tuple[Fraction, Term]] = []
    if not _collect(ev, operand, Fraction(1), atoms, Shape(operand.dtype, operand.shape), limit):
        return None
    count = Fraction(math.prod(operand.shape[k] for k in reduced))
    spread = [(k, _constant_along(a, reduced)) for k, a in atoms]
    if all(y is None for _, y in spread):
        return None
    out = Shape(t.dtype, t.shape)
    return [
        (k * count, y) if y is not None else (k, ev.normal("reduce", t.attrs, [a], out))
        for (k, a), (_, y) in zip(atoms, spread)
    ]


def _constant_along(t: Term, reduced: tuple[int, ...]) -> Term | None:
    """y where t broadcasts y along exactly the dims `reduced`, y's dims in t's order."""
    if t.op != "bcast":
        return None
    parts = BcastSpec.parse(t.attrs[0]).parts
    new = tuple(o for o, (kind, _) in enumerate(parts) if kind == "n")
    kept = [k for kind, k in parts if kind == "i"]
    return t.args[0] if new == tuple(sorted(reduced)) and kept == list(range(len(kept))) else None


def _key(atom: Term) -> tuple:
    return (atom.op, repr(atom.attrs), atom.shape)


def _signed(ev: Builder, atom: Term, c: Fraction, shape: Shape) -> Term | None:
    """c * atom, a negative c as a negation."""
    scaled = ev.scaled(atom, abs(c))
    if scaled is None:
        return None
    return scaled if c > 0 else ev.mk("unary", ("negate",), [scaled], shape)
