"""Sums of signed terms in one form.

Over the reals, a float value built by additions, subtractions, negations and constant factors is
the linear combination Σ c_i · a_i of the terms it adds up (its atoms); its value does not depend
on the order or the grouping. A cross-entropy written `lse - target` on a vocabulary shard, with
`lse = log(sum_exp) + m`, and the reference's `-((target - m) - log(sum_exp))` (log-softmax picked)
add up the same atoms with the same coefficients, but the saturation's regrouping rules only join
sums that both exist already. `one_form` builds the combination in one order (atoms sorted by their
op, coefficients merged per atom), which the translator states equal to the written term: two
programs that add up the same atoms, or atoms the proof shows equal at the same place of that
order, meet there.

Atoms whose coefficients cancel (x - x) are not dropped: x - x is not 0 where x is infinite, and
the form is then not built.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Protocol

from equivci.hlo.ir import Shape
from equivci.options import Budgets
from equivci.terms.ir import Term

LINEAR = (("add",), ("subtract",))
FLOATS = ("f32", "bf16", "f16", "f64")


class Builder(Protocol):
    """What the form needs of the builder (equivci.translate.builder.Builder)."""

    budgets: Budgets
    collective_sums: set[Term]

    def folded(self, term: Term): ...

    def scale_of(self, t: Term) -> tuple[Fraction, Term]: ...

    def scaled(self, base: Term, factor: Fraction) -> Term | None: ...

    def mk(self, op: str, attrs: tuple, args, shape: Shape) -> Term: ...


def one_form(ev: Builder, term: Term) -> Term | None:
    """The sum `term` adds up in one order, when it has a subtracted term (a difference or a
    negation, with its factors) and at most `budgets.signed_terms` atoms; None otherwise, or when it
    is that form already."""
    if term.dtype not in FLOATS or ev.folded(term) is not None:
        return None
    atoms: list[tuple[Fraction, Term]] = []
    if not _collect(ev, term, Fraction(1), atoms, ev.budgets.signed_terms) or len(atoms) < 2:
        return None
    if all(c > 0 for c, _ in atoms):
        return None  # a plain sum: the regrouping rules' business
    merged: dict[Term, Fraction] = {}
    for c, a in atoms:
        merged[a] = merged.get(a, Fraction(0)) + c
    if any(c == 0 for c in merged.values()):
        return None
    # sorted by what the atom is, not by where it was written; ties keep the written order
    ordered = sorted(merged.items(), key=lambda item: _key(item[0]))
    shape = Shape(term.dtype, term.shape)
    form = _signed(ev, *ordered[0], shape)
    for atom, c in ordered[1:]:
        part = _signed(ev, atom, abs(c), shape)
        if form is None or part is None:
            return None
        form = ev.mk("binary", ("add",) if c > 0 else ("subtract",), [form, part], shape)
    return None if form is None or form is term else form


def _collect(ev: Builder, t: Term, c: Fraction, out: list[tuple[Fraction, Term]], limit: int) -> bool:
    """Appends t's atoms times c to out; False past `limit` atoms."""
    factor, base = ev.scale_of(t)
    c *= factor
    if base in ev.collective_sums:  # one value (the reference's, or a partial sum's whole)
        out.append((c, base))
        return len(out) <= limit
    if base.op == "binary" and base.attrs in LINEAR and all(a.shape == base.shape for a in base.args):
        first, second = base.args
        sign = 1 if base.attrs == ("add",) else -1
        return _collect(ev, first, c, out, limit) and _collect(ev, second, c * sign, out, limit)
    if base.op == "unary" and base.attrs == ("negate",):
        return _collect(ev, base.args[0], -c, out, limit)
    out.append((c, base))
    return len(out) <= limit


def _key(atom: Term) -> tuple:
    return (atom.op, repr(atom.attrs), atom.shape)


def _signed(ev: Builder, atom: Term, c: Fraction, shape: Shape) -> Term | None:
    """c * atom, a negative c as a negation."""
    scaled = ev.scaled(atom, abs(c))
    if scaled is None:
        return None
    return scaled if c > 0 else ev.mk("unary", ("negate",), [scaled], shape)
