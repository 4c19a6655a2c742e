"""A running sum of a window is the window of the running sum, less what precedes the window.

With CS(v) the running sum of v along dim k (HLO: a reduce-window add whose window spans the whole
dim, padded by n - 1 before it and 1 wide elsewhere, as `jnp.cumsum` lowers) and u = v[a:b]
along k:

    CS(v)[a:b] = CS(u) + broadcast(sum(v[0:a]) along k)   (CS(u) itself for a = 0)
    CS(u)[n-1:n] = sum(u) along k, kept as a unit dim     (the last running sum is the total)
    CS(v[a:b along d]) = CS(v)[a:b along d] for d != k     (every lane along k sums on its own)

The first and third are stated equal beside the terms (`Builder.equal_terms`); the second is the normal form of
that slice (`Builder.slice_term`), so that a total however it is laid out next (squeezed for an
all-gather, kept [b, 1, c] for a psum) is a reshape of the sum, whose reshapes compose. A shard of a
sequence that adds the totals of the shards before it (a causal running mean over a sequence split
across devices) then meets the reference's running sum: the totals are the shards' sums, a sum over
the gathered totals is the sum of the kept ones (reductions.over_pieces), sums of adjacent windows
merge (rules reductions/merge_add), and what remains is the first fact.

Finite sums are associative and commutative, so totals of adjacent windows added in any order and
grouping are the total of their union (`merged_totals`): log-step doubling over ppermute adds the
earlier shards' totals as (s2 + s1) + (s0 + 0), where the rewrite rules only merge neighbours
written in window order.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Protocol

from equivci.hlo.ir import Instruction, Module, Shape
from equivci.terms.ir import Term
from equivci.terms.spec import ReduceSpec, bcast_spec
from equivci.translate import windows
from equivci.translate.attributes import semantic_attrs


class Builder(windows.Evaluator, Protocol):
    """What these facts need of the evaluator (an equivci.translate.builder.Builder, which calls
    `last_total` while it builds slices, so it cannot be imported here)."""

    module: Module
    equal_terms: list[list[Term]]
    window_sums: dict[Term, tuple]

    def binary(self, op: str, a: Term, b: Term, dtype: str | None = None) -> Term: ...

    def slice_term(self, x: Term, dim: int, start: int, stop: int) -> Term: ...

    def reshape_term(self, operand: Term, shape: Shape) -> Term: ...

    def factored(self, kind: str, attrs: tuple, args: list[Term], shape: Shape) -> Term | None: ...

    def uniform(self, t: Term) -> Fraction | None: ...


def note(ev: Builder, inst: Instruction, args: list, term: Term) -> None:
    """State the first fact for `term`, a reduce-window of args[0] (with init args[1]), when it is a
    running sum along one dim of a window of another value."""
    dim = running_dim(ev.window_sums, term)
    if dim is None or len(args) != 2:
        return
    u, init = args
    n = u.shape[dim]
    lifted = windows.window_form(ev, u)
    if lifted is None or lifted.whole.dtype != u.dtype:
        return
    if lifted.dim != dim:
        _lanes_stated(ev, inst, lifted, init, dim, term)
        return
    if lifted.stop - lifted.start != n:
        return
    whole, start = lifted.whole, lifted.start
    whole_sum = stated_running_sum(ev, inst, whole, init, dim)
    window = ev.slice_term(whole_sum, dim, start, start + n)
    if start == 0:
        ev.equal_terms.append([window, term])
        return
    before = _sum_along(ev, ev.slice_term(whole, dim, 0, start), dim)
    kept = tuple(k for k in range(len(term.shape)) if k != dim)
    spread = ev.mk("bcast", (bcast_spec(len(kept), term.shape, kept),), (before,), Shape(term.dtype, term.shape))
    ev.equal_terms.append([window, ev.binary("add", term, spread)])


def _lanes_stated(ev: Builder, inst: Instruction, lifted: windows.Window, init: Term, dim: int, term: Term) -> None:
    """Each lane along `dim` sums on its own: the running sums of a window along another dim (a
    device's token groups, its data-parallel rows) are that window of the running sums of the whole."""
    whole_sum = stated_running_sum(ev, inst, lifted.whole, init, dim)
    ev.equal_terms.append([ev.slice_term(whole_sum, lifted.dim, lifted.start, lifted.stop), term])


def stated_running_sum(ev: Builder, inst: Instruction, x: Term, init: Term, dim: int) -> Term:
    """The running sum of `x` along `dim` (`running_sum`), stated as the window of a wider one where
    x is a window along another dim: a device's rows of a {data, seq} mesh, whose running sum of
    its sequence window is related first to the running sum of its rows."""
    whole_sum = running_sum(ev, inst, x, init, dim)
    lifted = windows.window_form(ev, x)
    if lifted is not None and lifted.dim != dim and lifted.whole.dtype == x.dtype:
        _lanes_stated(ev, inst, lifted, init, dim, whole_sum)
    return whole_sum


def last_total(ev: Builder, x: Term, dim: int, start: int, stop: int) -> Term | None:
    """x[n-1:n] along dim as the sum of x's operand along dim (the unit dim kept), when x is a running
    sum along dim; None otherwise."""
    n = x.shape[dim]
    if (start, stop) != (n - 1, n) or running_dim(ev.window_sums, x) != dim:
        return None
    total = _sum_along(ev, x.args[0], dim)
    return ev.reshape_term(total, Shape(x.dtype, x.shape[:dim] + (1,) + x.shape[dim + 1 :]))


def merged_totals(ev: Builder, term: Term) -> Term | None:
    """sum(x[a:c]) along k when `term` adds up (in any order and grouping, zeros left out) the sums
    along k of windows of one value x along k that tile [a, c) without a gap or an overlap; None
    otherwise (a sum of one window, or more than `budgets.window_totals` of them)."""
    atoms: list[Term] = []
    stack = [term]
    while stack:
        t = stack.pop()
        if t.op == "binary" and t.attrs == ("add",):
            stack.extend(t.args)
        elif ev.uniform(t) != 0:
            if len(atoms) == ev.budgets.window_totals or t.op != "reduce" or t.attrs[0] != "add":
                return None
            atoms.append(t)
    pieces = []
    for t in atoms:
        dims = ReduceSpec.parse(t.attrs[1]).dims
        w = windows.window_form(ev, t.args[0]) if len(t.args) == 1 else None
        if w is None or (w.dim,) != dims:
            return None
        pieces.append(w)
    if len(pieces) < 2 or any((w.whole, w.dim) != (pieces[0].whole, pieces[0].dim) for w in pieces):
        return None
    pieces.sort(key=lambda w: w.start)
    if any(w.stop != nxt.start for w, nxt in zip(pieces, pieces[1:])):
        return None
    whole, dim = pieces[0].whole, pieces[0].dim
    merged = _sum_along(ev, ev.slice_term(whole, dim, pieces[0].start, pieces[-1].stop), dim)
    return merged if merged.shape == term.shape and merged.dtype == term.dtype else None


def running_dim(window_sums: dict[Term, tuple], term: Term) -> int | None:
    """k when `term` is a running sum along dim k: a windowed sum (`Builder.window_sums`) of size n
    and padding (n - 1, 0) along k, of size 1 without padding along every other dim."""
    found = window_sums.get(term)
    if found is None:
        return None
    sizes, pads = found
    along = [k for k, size in enumerate(sizes) if size != 1 or tuple(pads[k]) != (0, 0)]
    if len(along) != 1:
        return None
    k = along[0]
    n = term.shape[k]
    return k if sizes[k] == n and tuple(pads[k]) == (n - 1, 0) and n > 1 else None


def running_sum(ev: Builder, inst: Instruction, x: Term, init: Term, dim: int) -> Term:
    """The running sum of `x` along `dim` as the op `inst` (a running sum of a window of x) is
    written for all of x: the same reduce-window, its window and padding widened to x's dim."""
    n = x.shape[dim]
    sizes = [n if k == dim else 1 for k in range(len(x.shape))]
    pads = [(n - 1, 0) if k == dim else (0, 0) for k in range(len(x.shape))]
    window = "{size=" + "x".join(map(str, sizes)) + " pad=" + "x".join(f"{lo}_{hi}" for lo, hi in pads) + "}"
    whole = dataclasses.replace(inst, attrs={**inst.attrs, "window": window}, shape=Shape(inst.shape.dtype, x.shape))
    attrs = semantic_attrs(whole, ev.module)
    key = f"{whole.opcode}|{sorted(attrs.items())}|{whole.shape}"
    term = ev.mk("opaque", (key,), (x, init), whole.shape)
    ev.window_sums[term] = (sizes, pads)
    return term


def _sum_along(ev: Builder, x: Term, dim: int) -> Term:
    """The sum of `x` over `dim` (which it drops)."""
    key = ReduceSpec(len(x.shape), (dim,)).text()
    shape = Shape(x.dtype, tuple(s for k, s in enumerate(x.shape) if k != dim))
    return ev.factored("reduce", ("add", key), [x], shape) or ev.mk("reduce", ("add", key), (x,), shape)
