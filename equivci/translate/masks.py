"""Range masks of integer values and lookups in one window of a table (vocabulary parallelism).

A vocabulary-parallel lookup on shard d holds the rows [lo, hi) of a table T, masks the ids
outside them and looks up the rest locally:

    mask = (ids >= lo) & (ids < hi);  rows = T[lo:hi][where(mask, ids - lo, 0)];  out = rows * mask

Wherever the mask holds, `rows` is T[ids]: the evaluator remembers that (a `MaskedRows`), and an
all-reduce sum of such masked rows whose windows tile the range of the ids is T[ids] itself
(`tiled_lookup`). A max (or min) of the reductions of windows of one value along a reduced dim
that cover it is the reduction of the whole (`tiled_reduce`). These are facts the evaluator
checks exactly on constants (window bounds, element layouts), not e-graph rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np

from equivci.hlo.ir import Shape
from equivci.options import Budgets
from equivci.terms.ir import Term
from equivci.terms.spec import GatherDims, ReduceSpec, parse_compare
from equivci.translate import windows
from equivci.translate.arrays import all_equal

# compare direction -> (which end of the window it gives, offset to a half-open [lo, hi))
ENDS = {"GE": ("lo", 0), "GT": ("lo", 1), "LT": ("hi", 0), "LE": ("hi", 1)}
# a one-sided test's negation: x < k is not x >= k, x <= k is not x > k
NEGATED = {"GE": "LT", "LT": "GE", "GT": "LE", "LE": "GT"}
# Ops that only move (or, convert, retype) the elements of a mask.
LAYOUT_OPS = ("reshape", "bcast", "transpose")
UNBOUNDED = 1 << 64  # an open end of a window


@dataclasses.dataclass(frozen=True)
class Window:
    """The integer elements of `x` that lie in [lo, hi)."""

    x: Term
    lo: int
    hi: int

    def clipped(self, bounds: tuple[float, float] | None) -> "Window":
        """The same test restricted to the values x can take."""
        if bounds is None:
            return self
        return Window(self.x, max(self.lo, int(bounds[0])), min(self.hi, int(bounds[1]) + 1))


@dataclasses.dataclass(frozen=True)
class MaskedRows:
    """A lookup that equals `full` wherever the ids it was made from lie in `window`.

    `labels[o]` is the flat position, in `window.x`, of the id that output element o used.
    """

    full: Term
    window: Window
    labels: np.ndarray


class Evaluator(windows.Evaluator, Protocol):
    """What these facts need of the evaluator (an equivci.translate.builder.Builder), which uses them."""

    masked_rows: dict[Term, MaskedRows]
    budgets: Budgets

    def folded(self, term: Term) -> np.ndarray | None: ...

    def bounds_of(self, term: Term) -> tuple[float, float] | None: ...

    def numeric(self, t: Term, args: list[np.ndarray]) -> np.ndarray | None: ...

    def mk(self, op: str, attrs: tuple, args: tuple, shape: Shape) -> Term: ...

    def reshape_term(self, operand: Term, shape: Shape) -> Term: ...

    def gather_term(self, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None: ...


def scalar_int(ev: Evaluator, t: Term) -> int | None:
    """The value of an integer constant whose elements are all one number."""
    value = ev.folded(t)
    if value is None or t.dtype[0] not in "su" or not all_equal(value):
        return None
    return int(value.flat[0])


def window_of(ev: Evaluator, p: Term) -> Window | None:
    """p = (x >= lo) & (x < hi) on integers (GT / LE accepted) with constant ends; either test
    alone, or anded with a constant true (a test its bounds decided), leaves that end open."""
    tests = _conjuncts(ev, p)
    if not tests:
        return None
    found = [t for side in tests if (t := _test(ev, side)) is not None]
    return _window(ev, found) if len(found) == len(tests) else None


def outside_of(ev: Evaluator, p: Term) -> Window | None:
    """The window whose complement p tests: not(w), or (x < lo) | (x >= hi) (LE / GT accepted),
    the negation of (x >= lo) & (x < hi) by De Morgan's law; each one-sided test negated is the
    test of the other direction (x < lo is not x >= lo). Either test alone leaves an end open."""
    if p.op == "unary" and p.attrs == ("not",) and p.dtype == "pred":
        return window_of(ev, p.args[0])
    tests = _disjuncts(ev, p)
    if not tests:
        return None
    found = [(NEGATED[t[0]], t[1], t[2]) for side in tests if (t := _test(ev, side)) is not None]
    return _window(ev, found) if len(found) == len(tests) else None


def _test(ev: Evaluator, side: Term) -> tuple[str, Term, int] | None:
    """A one-sided test `x direction k` of an integer x against an integer constant k."""
    compare = parse_compare(side.attrs[0]) if side.op == "binary" else None
    if compare is None:
        return None
    direction = compare[0]
    x, k = side.args
    value = scalar_int(ev, k)
    if direction not in ENDS or value is None or x.dtype[0] not in "su":
        return None
    return direction, x, value


def _window(ev: Evaluator, tests: list[tuple[str, Term, int]]) -> Window | None:
    """The window the one-sided tests of one value bound together."""
    ends = {"lo": -UNBOUNDED, "hi": UNBOUNDED}
    xs = set()
    for direction, x, value in tests:
        end, offset = ENDS[direction]
        x, shift = _offset_base(ev, x)
        value += shift + offset
        ends[end] = max(ends[end], value) if end == "lo" else min(ends[end], value)
        xs.add(x)
    if len(xs) != 1:
        return None
    return Window(xs.pop(), ends["lo"], ends["hi"])


def _split_offset(ev: Evaluator, x: Term) -> tuple[Term, int]:
    """x as (y, c) with x = y - c (or y + -c) for a constant c; (x, 0) when it is neither."""
    if x.op == "binary" and x.attrs in (("subtract",), ("add",)) and x.args[0].dtype == x.dtype:
        c = scalar_int(ev, x.args[1])
        if c is not None:
            return x.args[0], c if x.attrs == ("subtract",) else -c
    return x, 0


def _offset_base(ev: Evaluator, x: Term) -> tuple[Term, int]:
    """x as (y, c) with x = y - c, where y - c cannot wrap around for any value y can take: a test
    of ids - lo against [0, n) is then a test of ids against [lo, lo + n) (a per-shard offset
    mask). (x, 0) otherwise."""
    y, c = _split_offset(ev, x)
    bounds = ev.bounds_of(y)
    if y is x or bounds is None:
        return x, 0
    limits = np.iinfo({"s": "int", "u": "uint"}[x.dtype[0]] + x.dtype[1:])
    if not (limits.min <= bounds[0] - c and bounds[1] - c <= limits.max):
        return x, 0
    return y, c


def _conjuncts(ev: Evaluator, p: Term) -> list[Term]:
    """The tests p ands together, without constant-true ones."""
    return _operands(ev, p, "and")


def _disjuncts(ev: Evaluator, p: Term) -> list[Term]:
    """The tests p ors together, without constant-false ones."""
    return _operands(ev, p, "or")


def _operands(ev: Evaluator, p: Term, op: str) -> list[Term]:
    """The tests p joins by `op` (and, or), without the constants that leave the join unchanged."""
    value = ev.folded(p)
    if value is not None:
        neutral = value.size and (np.all(value) if op == "and" else not np.any(value))
        return [] if neutral else [p]
    if p.op == "binary" and p.attrs == (op,) and p.dtype == "pred":
        return [t for a in p.args for t in _operands(ev, a, op)]
    return [p]


def bounds_under_mask(ev: Evaluator, p: Term, a: Term, outside: bool = False) -> tuple[float, float] | None:
    """The bounds of `a` where the range test `p` holds (where it fails if `outside`: p is then
    the complement of a window test): a = x or a = x - c with p testing x."""
    w = outside_of(ev, p) if outside else window_of(ev, p)
    if w is None:
        return None
    w = w.clipped(ev.bounds_of(w.x))
    shift = shift_from(ev, a, w.x)
    if shift is None:
        return None
    if w.hi <= w.lo:  # the test never holds: `a` is never chosen
        return None
    lo, hi = w.lo - shift, w.hi - 1 - shift
    limits = np.iinfo({"s": "int", "u": "uint"}[a.dtype[0]] + a.dtype[1:])
    if not (limits.min <= lo and hi <= limits.max):  # x - c could wrap around: no bounds
        return None
    return float(lo), float(hi)


def through_select(ev: Evaluator, w: Window) -> Window:
    """A window test of select(p, k, ids - c) (reshaped, branches in either order) with every element
    of the constant k outside the window, as the window test of the ids: it holds exactly where the
    other branch is chosen and ids - c lies in the window, so where ids lie in both p's window (or
    its complement) and [lo + c, hi + c), ids - c not wrapping around for the ids' bounds. A
    `take(rows, where(ids < lo, n, ids - lo), mode="fill")` fills where its index leaves [0, n), which
    is where ids leave [lo, lo + n). The window itself otherwise."""
    w = w.clipped(ev.bounds_of(w.x))
    chosen = w.x
    while chosen.op == "reshape":
        chosen = chosen.args[0]
    if chosen.op != "ternary" or chosen.attrs != ("select",):
        return w
    p, a, b = chosen.args
    for constant, other, outside in ((a, b, True), (b, a, False)):
        value = ev.folded(constant)
        if value is None or not value.size or any(w.lo <= int(v) < w.hi for v in np.unique(value)):
            continue
        guard = outside_of(ev, p) if outside else window_of(ev, p)
        ids, c = _offset_base(ev, other)
        if guard is None or guard.x is not ids:
            continue
        return Window(ids, max(guard.lo, w.lo + c), min(guard.hi, w.hi + c)).clipped(ev.bounds_of(ids))
    return w


def shift_from(ev: Evaluator, a: Term, x: Term) -> int | None:
    """c where a = x - c (or x + -c) for a constant c; also where a = reshape(y - c) and
    x = reshape(y), alike (a reshape keeps the elements' flat order)."""
    if a is x:
        return 0
    if a.op == "reshape" and x.op == "reshape" and a.attrs == x.attrs and a.args[0].shape == x.args[0].shape:
        return shift_from(ev, a.args[0], x.args[0])
    y, c = _split_offset(ev, a)
    return c if y is x and y is not a else None


def laid_out_window(ev: Evaluator, m: Term, outside: bool = False) -> tuple[Window, np.ndarray] | None:
    """`m` as a range test (its complement if `outside`) moved by layout ops (and converted from
    pred), with the flat position in the tested value of the element each element of `m` comes from."""
    chain = []
    while m.op in LAYOUT_OPS or (m.op == "unary" and m.attrs == ("convert",) and m.args[0].dtype == "pred"):
        chain.append(m)
        m = m.args[0]
    w = outside_of(ev, m) if outside else window_of(ev, m)
    if w is None or int(np.prod(m.shape)) > ev.budgets.mask_labels:
        return None
    w = _unreshaped(ev, through_select(ev, w))  # labels are flat positions, which a reshape keeps
    labels = np.arange(int(np.prod(m.shape))).reshape(m.shape)
    for t in reversed(chain):
        if t.op != "unary":
            moved = ev.numeric(t, [labels])
            if moved is None:
                return None
            labels = moved
    return w, np.asarray(labels)


def masked_lookup(ev: Evaluator, x: Term, idx: Term, dims: GatherDims, out: Shape) -> MaskedRows | None:
    """A gather from the window [s, e) of T along its one indexed dim (a slice of T, or a value made
    from one by ops the window passes through), at where(mask, ids - s, z), a clamp of ids - s or
    ids - s itself (reshaped): T[ids] wherever the mask holds (the clamp, and the gather's own clamp
    of its index into [0, e - s - 1], leave ids - s as it is where ids lie in [s, e))."""
    lifted = windows.window_along(ev, x, dims.start_map[0]) if len(dims.start_map) == 1 else None
    if (
        lifted is None
        or dims.start_map[0] != lifted.dim
        or dims.start_map[0] not in dims.collapsed
        or int(np.prod(idx.shape)) > ev.budgets.mask_labels
    ):
        return None
    table, s, e = lifted.whole, lifted.start, lifted.stop
    chosen = idx
    while chosen.op == "reshape":
        chosen = chosen.args[0]
    found = index_window(ev, chosen, e - s, s)
    if found is None:
        return None
    w, shift = found
    if shift != s or w.lo < s or w.hi > e:  # where the ids lie in w, the local index must be id - s, in the window
        return None
    # the ids as the value they reshape (labels are flat positions, which a reshape keeps), as the
    # masks that test them are read (`laid_out_window`): an index vector's unit dim XLA's partitioner
    # adds to take_along_axis's ids, `ids[..., None, None] - lo`, masked by tests of those ids
    w = _unreshaped(ev, w)
    full_idx = ev.reshape_term(w.x, Shape(idx.dtype, idx.shape))
    full = ev.gather_term(table, full_idx, dims, out)
    labels = gather_labels(np.arange(int(np.prod(idx.shape))).reshape(idx.shape), dims, out.dims)
    if full is None or labels is None:
        return None
    return MaskedRows(full, w, labels)


def index_window(ev: Evaluator, chosen: Term, size: int, wanted: int | None = None) -> tuple[Window, int] | None:
    """(w, c) such that a gather along a dim of `size` elements at `chosen` reads element ids - c
    wherever the ids lie in w: where(ids in w, ids - c, z), where(ids outside w, z, ids - c), a
    clamp of ids - c to [lo, hi] with w = [lo + c, hi + c] (there it leaves ids - c as it is), or
    ids - c itself (c may be 0) with w = [c, c + size) (the gather clamps its index into [0, size - 1], which
    leaves ids - c as it is there: `jnp.take(rows, ids - first, mode="clip")`); a select's window is
    narrowed to [c, c + size) for that clamp. A select whose two branches are both such offsets
    gives the one of offset `wanted` when given: take_along_axis wraps a negative index,
    where(ids - c < 0, ids - c + n, ids - c), which reads ids - c for ids in [c, c + n)."""
    if chosen.op == "ternary" and chosen.attrs == ("select",):
        p, a, b = chosen.args
        for kept, outside in ((a, False), (b, True)):
            w = outside_of(ev, p) if outside else window_of(ev, p)
            if w is None or bounds_under_mask(ev, p, kept, outside) is None:
                continue
            shift = shift_from(ev, kept, w.x)
            if shift is not None and wanted in (None, shift):
                # the gather reads ids - c as it is only in [0, size): it clamps the rest
                read = Window(w.x, max(w.lo, shift), min(w.hi, shift + size))
                return _unreshaped(ev, read.clipped(ev.bounds_of(w.x))), shift
        return None
    clamped = clamp_form(ev, chosen)
    if clamped is not None:
        lo, a, hi = clamped
        ids, shift = _split_offset(ev, a)
        return Window(ids, lo + shift, hi + shift + 1).clipped(ev.bounds_of(ids)), shift
    ids, shift = _split_offset(ev, chosen)  # (chosen, 0) when it is no offset: the first shard's ids
    return Window(ids, shift, shift + size).clipped(ev.bounds_of(ids)), shift


def _unreshaped(ev: Evaluator, w: Window) -> Window:
    """The window of a reshaped value as the window of the value it reshapes: the same test of the
    same elements in flat order (a lookup's labels are flat positions), clipped to its bounds."""
    while w.x.op == "reshape":
        w = Window(w.x.args[0], w.lo, w.hi).clipped(ev.bounds_of(w.x.args[0]))
    return w


def clamp_form(ev: Evaluator, t: Term) -> tuple[int, Term, int] | None:
    """t as (lo, x, hi) with t = clamp(lo, x, hi) for constants lo <= hi: HLO's clamp, or
    min(hi, max(lo, x)) / max(lo, min(hi, x)) as jnp.clip writes it (operands in either order)."""
    if t.op == "ternary" and t.attrs == ("clamp",):
        lo, x, hi = scalar_int(ev, t.args[0]), t.args[1], scalar_int(ev, t.args[2])
    else:
        outer = _with_constant(ev, t)
        inner = _with_constant(ev, outer[1]) if outer is not None else None
        if outer is None or inner is None or {outer[0], inner[0]} != {"minimum", "maximum"}:
            return None
        (_, _, first), (_, x, second) = outer, inner
        lo, hi = (second, first) if outer[0] == "minimum" else (first, second)
    if lo is None or hi is None or lo > hi or x.dtype[0] not in "su":
        return None
    return lo, x, hi


def _with_constant(ev: Evaluator, t: Term) -> tuple[str, Term, int] | None:
    """t = op(x, c) or op(c, x) for op minimum / maximum and an integer constant c: (op, x, c)."""
    if t.op != "binary" or t.attrs not in (("minimum",), ("maximum",)):
        return None
    for x, k in (t.args, t.args[::-1]):
        c = scalar_int(ev, k)
        if c is not None and scalar_int(ev, x) is None:
            return t.attrs[0], x, c
    return None


def gather_labels(idx_labels: np.ndarray, dims: GatherDims, out: tuple[int, ...]) -> np.ndarray | None:
    """For each output element of a gather, the label of the index it used."""
    if dims.vector_dim < idx_labels.ndim:
        if idx_labels.shape[dims.vector_dim] != 1:
            return None
        idx_labels = np.take(idx_labels, 0, axis=dims.vector_dim)
    batch_out = [o for o in range(len(out)) if o not in dims.offset]
    if len(batch_out) != idx_labels.ndim:
        return None
    # The index dims map to the output's non-offset dims in order.
    expanded = idx_labels.reshape([out[o] if o in batch_out else 1 for o in range(len(out))])
    return np.broadcast_to(expanded, out)


def masked_member(ev: Evaluator, m: Term) -> tuple[Term, Window] | None:
    """A psum member that is rows masked by the range test they were looked up under:
    rows * mask, where(mask, rows, 0), or where(outside, 0, rows) with `outside` the test's
    complement (select(not p, 0, r) = select(p, r, 0)); as (T[ids], the window). A constant factor
    the builder moved out of the mask, c * where(mask, rows, 0) with c * rows the lookup (a pick of
    soft-capped logits, `cap * tanh(l / cap)`), is where(mask, c * rows, 0): exact, the masked
    elements are zeros either way."""
    factor, base = ev.scale_of(m)
    if factor != 1:
        found = _masked(ev, base, lambda rows: ev.scaled(rows, factor))
        if found is not None:
            return found
    return _masked(ev, m, lambda rows: rows)


def _masked(ev: Evaluator, m: Term, looked_up: Callable[[Term], Term | None]) -> tuple[Term, Window] | None:
    """`masked_member` of m, with `looked_up(rows)` the lookup the masked rows stand for."""
    if m.op == "binary" and m.attrs == ("multiply",):
        candidates = [(m.args[0], m.args[1], False), (m.args[1], m.args[0], False)]
    elif m.op == "ternary" and m.attrs == ("select",) and _is_zero(ev, m.args[2]):
        candidates = [(m.args[1], m.args[0], False)]
    elif m.op == "ternary" and m.attrs == ("select",) and _is_zero(ev, m.args[1]):
        candidates = [(m.args[2], m.args[0], True)]
    else:
        return None
    for rows, mask, outside in candidates:
        lookup = looked_up(rows)
        known = known_rows(ev, lookup) if lookup is not None else None
        tested = laid_out_window(ev, mask, outside)
        if known is None or tested is None:
            continue
        w, labels = tested
        w = w.clipped(ev.bounds_of(w.x))
        # The mask must test the same ids at the same positions, and only inside the lookup's window.
        same_ids = w.x is known.window.x and labels.shape == known.labels.shape and np.array_equal(labels, known.labels)
        if same_ids and (w.hi <= w.lo or known.window.lo <= w.lo and w.hi <= known.window.hi):
            return known.full, w
    return None


def known_rows(ev: Evaluator, rows: Term) -> MaskedRows | None:
    """The lookup `rows` is, also through a reshape of it (the builder drops a gather's size-1
    dims, `take_along_axis(l, i[..., None])` before its squeeze): each element keeps its index. A
    constant factor in front of the reshape is read inside it, c * reshape(y) = reshape(c * y): XLA's
    partitioner picks from soft-capped logits `cap * tanh(l / cap)` and squeezes the pick, the
    builder keeps the factor in front of both."""
    if (known := ev.masked_rows.get(rows)) is not None:
        return known
    factor, base = ev.scale_of(rows)
    if base.op != "reshape" or (inner_rows := ev.scaled(base.args[0], factor)) is None:
        return None
    inner = ev.masked_rows.get(inner_rows)
    if inner is None:
        return None
    shape = Shape(rows.dtype, rows.shape)
    return MaskedRows(ev.reshape_term(inner.full, shape), inner.window, inner.labels.reshape(rows.shape))


def _is_zero(ev: Evaluator, t: Term) -> bool:
    value = ev.folded(t)
    return value is not None and value.size > 0 and not np.any(value)


def tiles(windows: list[tuple[int, int]], lo: int, hi: int, overlap: bool = False) -> bool:
    """Whether the windows cover [lo, hi) (each value in exactly one of them unless `overlap`)."""
    covered = lo
    for start, stop in sorted(w for w in windows if w[1] > w[0]):
        if start > covered or (start < covered and not overlap):
            return False
        covered = max(covered, stop)
    return covered >= hi


def tiled_lookup(ev: Evaluator, members: list[Term]) -> Term | None:
    """The sum of rows masked by range tests that tile the range of the ids: the rows."""
    found = [f for m in members if (f := masked_member(ev, m)) is not None]
    if len(found) != len(members) or len({f[0] for f in found}) != 1 or len({f[1].x for f in found}) != 1:
        return None
    full, w = found[0]
    bounds = ev.bounds_of(w.x)
    if bounds is None or full.shape != members[0].shape or full.dtype != members[0].dtype:
        return None
    if not tiles([(f[1].lo, f[1].hi) for f in found], int(bounds[0]), int(bounds[1]) + 1):
        return None
    return full


def tiled_reduce(ev: Evaluator, reducer: str, members: list[Term]) -> Term | None:
    """max (min) of reduce-max (min) over windows of one value along a reduced dim, the windows
    covering that dim: the reduce of the whole value."""
    if reducer not in ("maximum", "minimum") or any(m.op != "reduce" or m.attrs != members[0].attrs for m in members):
        return None
    operands = [windows.window_form(ev, m.args[0]) for m in members]
    first = operands[0]
    if first is None or any(o is None or o.whole is not first.whole or o.dim != first.dim for o in operands):
        return None
    whole, dim = first.whole, first.dim
    reduced = set(ReduceSpec.parse(members[0].attrs[1]).dims)
    if members[0].attrs[0] != reducer or dim not in reduced:
        return None
    if not tiles([(o.start, o.stop) for o in operands if o is not None], 0, whole.shape[dim], overlap=True):
        return None
    return ev.mk("reduce", members[0].attrs, (whole,), Shape(members[0].dtype, members[0].shape))
