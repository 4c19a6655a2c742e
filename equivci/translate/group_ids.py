"""The group of each sorted row, as `jnp.repeat(arange(E), bincount(v), total_repeat_length=n)`
computes it: marks at the groups' first rows, then a running count of the marks.

With C = bincount(v) for v of n entries in [0, E), the groups of sorted(v) start at
S[e] = C[0] + ... + C[e-1] (an exclusive cumsum) and end at ends[e] = S[e] + C[e]. A scatter-add
of ones at S into zeros[n] (S[e] = n, an empty last group, is dropped as out of range), summed
cumulatively, counts at row b the groups with S[e] <= b. S[e] <= b holds iff fewer than b + 1
entries of v are < e, iff sorted(v)[b] >= e; so the count is sorted(v)[b] + 1. Marked at the ends
instead, it is sorted(v)[b] (ends[e] <= b iff sorted(v)[b] > e). The handler states the cumsum
as the sorted keys plus that offset; the sorted keys are the values output of the stable sort of
(v, arange(n)) the argsort makes, so permutations.py follows the rows from there.
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.translate import cumsums
from equivci.translate.builder import Builder, Value
from equivci.translate.opaque import opaque
from equivci.translate.permutations import Permutations
from equivci.translate.routing import evaluate
from equivci.translate.sorts import sorted_lanes


def reduce_window(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    term = opaque(ev, inst, args)
    if isinstance(term, Term) and (ids := sorted_group_ids(ev, term)) is not None:
        return ids
    if isinstance(term, Term):
        cumsums.note(ev, inst, args, term)
    return term


def sorted_group_ids(ev: Builder, counted: Term) -> Term | None:
    """sorted(v) + offset when `counted` is the cumsum of ones scattered at the group starts
    (offset 1) or ends (offset 0) of C = bincount(v) over all n = len(v) rows, else None."""
    perms = Permutations(ev)
    marks = perms.cumsum_of(counted)
    if marks is None or ev.row_scatters.get(marks) != "add" or counted.dtype[0] not in "su":
        return None
    zeros, idx, ones = marks.args
    z, o = ev.folded(zeros), ev.folded(ones)
    if z is None or o is None or np.any(z != 0) or np.any(o != 1) or idx.op != "reshape":
        return None
    n = counted.shape[0]
    for at in _candidates(idx.args[0]):
        found = _bounds_form(perms, at)
        v = None if found is None else perms.bincount_of(found[0])
        if found is not None and v is not None and int(np.prod(v.shape)) == n and _marks_at(ev, idx.args[0], at, n):
            offset = found[1]
            break
    else:
        return None
    keys = v if len(v.shape) == 1 else ev.reshape_term(v, Shape(v.dtype, (n,)))
    iota = ev.const(np.arange(n, dtype=np.int32), "s32")
    ids = sorted_lanes(ev, keys, iota, 0, "LT", [keys.dtype, "s32"])[0]
    if ids.dtype != counted.dtype:
        ids = ev.normal("unary", ("convert",), (ids,), Shape(counted.dtype, ids.shape))
    if offset == 0:
        return ids
    one = ev.const(np.full(ids.shape, offset, dtype=NP_DTYPES[ids.dtype]), ids.dtype)
    return ev.binary("add", ids, one)


def _bounds_form(perms: Permutations, at: Term) -> tuple[Term, int] | None:
    """(C, 1) when `at` is the exclusive cumsum of C (ends - C, [0, ends[:-1]], or the cumsum of
    [0, C[:-1]] as jnp.repeat writes it), (C, 0) when it is the inclusive cumsum of C."""
    inner = perms.cumsum_of(at)
    if inner is not None and inner.op == "concat" and len(inner.args) == 2 and inner.args[1].op == "slice":
        shifted = inner.args[1].args[0]  # [0, C[:-1]] is C shifted as [0, ends[:-1]] shifts ends
        return (shifted, 1) if perms.starts_of(inner, shifted, shifted) else None
    if inner is not None:
        return inner, 0
    ends: Term | None = None
    if at.op == "binary":  # ends - C
        ends = at.args[0]
    elif at.op == "concat" and len(at.args) == 2 and at.args[1].op == "slice":  # [0, ends[:-1]]
        ends = at.args[1].args[0]
    counts = None if ends is None else perms.cumsum_of(ends)
    if ends is None or counts is None:
        return None
    return (counts, 1) if perms.starts_of(at, ends, counts) else None


def _candidates(g: Term) -> list[Term]:
    """The values g is computed from by elementwise ops (g itself first): where the group bounds
    may be, under a negative index's wrap. `_marks_at` then checks g is a function of that one."""
    out, stack, seen = [], [g], set()
    while stack:
        t = stack.pop()
        if id(t) in seen or t.shape != g.shape:
            continue
        seen.add(id(t))
        out.append(t)
        if t.op in ("unary", "binary", "ternary"):
            stack.extend(t.args)
    return out


def _marks_at(ev: Builder, g: Term, at: Term, n: int) -> bool:
    """g(k) = k for every k in [0, n]: the scatter's index arithmetic (a negative index's wrap)
    keeps the group bounds, which lie in [0, n] (sums of counts of n entries)."""
    if len(at.shape) != 1 or g.shape != at.shape:
        return False
    np_dtype = NP_DTYPES.get(at.dtype, np.int64)
    for k in range(n + 1):
        value = evaluate(ev, g, {at: np.full(at.shape, k, dtype=np_dtype)})
        if value is None or np.any(value != k):
            return False
    return True


HANDLERS = {"reduce-window": reduce_window}
