"""A sum over the k choices of a router, unrolled, as the dot over the choices.

A reference that loops over its top-k choices adds, for each choice j, the choice's weight times
the value gathered at the choice's index:

    sum_j w[..., j] * y[..., idx[..., j], ...] = dot(w, y[..., idx, ...]) over j

(the gather at the whole index, `idx[..., a:a+K]`, picks for lane j what the gather at
`idx[..., a+j]` picks; the dot over the choices adds them up with their weights, in any order over
the reals). picks.weighted_pick then states that dot as the weights' one-hot against every
expert's value, which an expert-parallel device computes for its experts.

Stated only for a sum whose terms are exactly one product per choice j of a run [a, a+K) of the
weights' lanes (each window of the weights once, the index windows at a fixed offset from them),
every product of the same gathered value, as the dot of the weights' window [a, a+K): a top-k's raw
values `top_p[:, j]` are windows of the sort whose first k the builder reads them as, so its run
[0, K) is not all of its lanes; a choice counted twice, a term that is no choice, or an index window
that does not follow its weight's stays as written.
"""

from __future__ import annotations

import dataclasses

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.spec import BcastSpec, DotSpec, GatherDims
from equivci.translate import gathered_dots, reductions
from equivci.translate.builder import Builder


@dataclasses.dataclass(frozen=True)
class Choice:
    """One term of the sum: w's window [j, j+1) along `w_dim` times the gather of `dense` at the
    index's window [start, start+1) along `idx_dim`."""

    w: Term
    w_dim: int
    j: int
    dense: Term
    dims: GatherDims
    idx: Term
    idx_dim: int
    start: int


def summed_choices(ev: Builder, term: Term) -> Term | None:
    """The dot over the choices that the sum `term` adds up unrolled (a constant factor the builder
    moved in front of the sum stays in front of the dot); None when it is no such sum."""
    factor, base = ev.scale_of(term)
    if factor != 1:
        inner = summed_choices(ev, base)
        return None if inner is None else ev.scaled(inner, factor)
    atoms, stack = [], [term]
    while stack:
        t = stack.pop()
        if t.op == "binary" and t.attrs == ("add",) and all(a.shape == term.shape for a in t.args):
            stack.extend(t.args)
        else:
            atoms.append(t)
    choices = [_choice(ev, t) for t in atoms]
    if len(choices) < 2 or any(c is None for c in choices):
        return None
    found = [c for c in choices if c is not None]
    first = found[0]
    same = (first.w, first.w_dim, first.dense, first.dims, first.idx, first.idx_dim, first.start - first.j)
    if any((c.w, c.w_dim, c.dense, c.dims, c.idx, c.idx_dim, c.start - c.j) != same for c in found):
        return None
    # the choices are a run [j0, j0 + k) of the weights' lanes: all of them, or the first k of a
    # sort the builder reads a top-k's values as
    j0, k = min(c.j for c in found), len(found)
    if sorted(c.j for c in found) != list(range(j0, j0 + k)):
        return None
    lanes = len(first.idx.shape) - 1
    if first.dims.offset != tuple(range(lanes, len(term.shape))):  # the lanes lead the gather's output
        return None
    w = first.w if k == first.w.shape[first.w_dim] else ev.slice_term(first.w, first.w_dim, j0, j0 + k)
    # the gather at the whole index: its lane `idx_dim` inserted before the window dims
    at = j0 + first.start - first.j
    idx = ev.slice_term(first.idx, first.idx_dim, at, at + k)
    dims = dataclasses.replace(
        first.dims,
        offset=tuple(o + 1 for o in first.dims.offset),
        indices_batch=tuple(j + (j >= first.idx_dim) for j in first.dims.indices_batch),
        vector_dim=len(idx.shape),
    )
    picked = ev.gather_term(first.dense, idx, dims, Shape(term.dtype, (*idx.shape, *term.shape[lanes:])))
    if picked is None or w.dtype != term.dtype:
        return None
    w_lanes = tuple(d for d in range(len(w.shape)) if d != first.w_dim)
    idx_lanes = tuple(d for d in range(len(idx.shape)) if d != first.idx_dim)
    spec = DotSpec(
        w_lanes,
        idx_lanes,
        (first.w_dim,),
        (first.idx_dim,),
        len(w.shape),
        len(picked.shape),
        (term.dtype, term.dtype),
    )
    return reductions.dot_with_facts(ev, spec, w, picked, Shape(term.dtype, term.shape))


def _choice(ev: Builder, t: Term) -> Choice | None:
    """t = bcast(w[..., j]) * y[..., idx[..., s], ...] (either order), the weight broadcast along
    the gather's window dims onto its lanes in order; None otherwise."""
    if t.op != "binary" or t.attrs != ("multiply",):
        return None
    for spread, value in (t.args, t.args[::-1]):
        form = gathered_dots.lane_form(ev, value)
        if spread.op != "bcast" or form is None:
            continue
        lanes = [o for o in range(len(t.shape)) if o not in form.dims.offset]
        parts = BcastSpec.parse(spread.attrs[0]).parts
        if [parts[o] for o in lanes] != [("i", m) for m in range(len(lanes))]:
            continue
        if any(kind == "i" for o, (kind, _) in enumerate(parts) if o not in lanes):
            continue
        w = _unit_window(spread.args[0])
        at = _unit_window(form.idx)
        if (
            w is None
            or at is None
            or w[0].shape[: w[1]] + w[0].shape[w[1] + 1 :] != at[0].shape[: at[1]] + at[0].shape[at[1] + 1 :]
        ):
            continue
        return Choice(w[0], w[1], w[2], form.dense, form.dims, at[0], at[1], at[2])
    return None


def _unit_window(t: Term) -> tuple[Term, int, int] | None:
    """(x, d, s) when t is x[..., s, ...] along d: the window [s, s+1) of x with that dim dropped."""
    if t.op != "reshape" or t.args[0].op != "slice":
        return None
    window = t.args[0]
    d, start, stop = window.attrs
    x = window.args[0]
    if stop - start != 1 or t.shape != x.shape[:d] + x.shape[d + 1 :]:
        return None
    return x, d, start
