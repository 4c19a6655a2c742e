"""Sort-based dispatch: rows put in the order of a stable argsort, computed on row by row, put back.

P = argsort(v), the index output of a sort of (v, arange(n)) ascending by v, is a permutation of
[0, n) that sorts v. A value V is tracked as `Permuted(dense, row)`: V is `dense` with its rows
(dim `row`) taken in the order P, V[.., b, ..] = dense[.., P[b], ..]. The facts, each a general
identity (tests/translate/test_permutations.py checks them on random draws):

* gather(X, P) along rows, and the sorted keys sort(v) = gather(v, P), are X and v permuted; so
  are the rows X[I[P]] of indices I permuted (the token of each (token, choice) pair of a top-k);
* an elementwise op, a broadcast, a reduce over other dims, a dot with the row dim free, applied to
  values permuted by one P along one row dim (and values that do not vary along that dim), is the
  op on the dense values, permuted;
* segment bounds: with C = bincount(v) for v in [0, E) (a scatter-add of ones, or a one-hot
  summed), ends = cumsum(C) and starts = ends - C (or [0, ends[:-1]]),
  the ragged group mask `starts[e] <= b < ends[e]` is `sorted(v)[b] == e`: the one-hot
  `v[t] == e`, permuted (sorted(v) is nondecreasing, and starts[e] of its entries are < e);
* putting the rows back undoes P: scatter(V at rows P), a scatter-add of V at P into zeros and
  gather(V, argsort(P)) are `dense`.

The last gives the facts handed to the prover: a sort-based dispatch becomes a row-wise
computation with no sort, which the rules relate shard by shard.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import (
    AlignedMap,
    BcastSpec,
    DotSpec,
    GatherDims,
    ReduceSpec,
    compare_text,
    parse_compare,
    parse_transpose,
    transpose_text,
)
from equivci.translate.builder import Builder
from equivci.translate.reductions import reduced_over
from equivci.translate.routing import evaluate
from equivci.translate.shapes import broadcast_term

ELEMENTWISE = ("unary", "binary", "ternary")


@dataclasses.dataclass(frozen=True)
class Permuted:
    """The value is `dense` with its rows along dim `row` taken in the order `perm` (an argsort)."""

    dense: Term
    row: int
    perm: Term


class Permutations:
    def __init__(self, ev: Builder):
        self.ev = ev
        self.found: dict[Term, Permuted | None] = {}
        self.facts: list[tuple[Term, Term]] = []
        self.sorts: dict[Term, list[Term]] = {}  # v -> the argsorts of v in the program

    def run(self, outputs: list[Term]) -> None:
        """Relate every put-back (a scatter or gather by an argsort) under `outputs` to its dense value."""
        terms: dict[int, Term] = {}
        stack = list(outputs)
        while stack:
            t = stack.pop()
            if id(t) not in terms:
                terms[id(t)] = t
                stack.extend(t.args)
        for t in terms.values():
            if (keys := self.argsort(t)) is not None:
                self.sorts.setdefault(keys, []).append(t)
        if not self.sorts:
            return
        for t in terms.values():
            dense = self.put_back(t)
            if dense is not None:
                self.facts.append((t, dense))

    # -- permutations --------------------------------------------------------------------------
    def argsort(self, p: Term) -> Term | None:
        """v when `p` is the index output of a sort of (v, arange(n)) ascending by v along its only dim."""
        if p.op != "aligned" or len(p.shape) != 1 or AlignedMap.op_key(p.attrs[0]) != "sort:LT:0:1":
            return None
        v, iota = p.args
        value = self.ev.folded(iota)
        return v if value is not None and np.array_equal(value, np.arange(p.shape[0])) else None

    def rows_of(self, idx: Term) -> Term | None:
        """P when `idx` is an argsort P reshaped to [n, 1] (the row indices of a scatter)."""
        if idx.op != "reshape" or idx.shape != (idx.args[0].shape[0], 1):
            return None
        return idx.args[0] if self.argsort(idx.args[0]) is not None else None

    # -- put back --------------------------------------------------------------------------------
    def put_back(self, t: Term) -> Term | None:
        if self.ev.row_scatters.get(t) == "set":  # out[P[b]] = V[b] writes every row once
            perm = self.rows_of(t.args[1])
            return None if perm is None else self.dense_of(t.args[2], perm, t)
        if t.op == "aligned" and (gathered := self._row_gather(t)) is not None:
            x, q = gathered  # x[argsort(P)] with x = dense[P]: dense_of checks x is permuted by P
            perm = self.argsort(q)
            return None if perm is None else self.dense_of(x, perm, t)
        if t.op == "dot":
            return self._added_back(t)
        return None

    def _added_back(self, t: Term) -> Term | None:
        """A scatter-add of V's rows at P (scatter_adds.windows: dot(V, onehot(P)) over the rows, the
        row dim last) is the dense value with its row dim last: P hits every row once."""
        spec = DotSpec.parse(t.attrs[0])
        v, onehot = t.args
        found = self.info(v)
        if (
            found is None
            or spec.lhs_batch
            or spec.lhs_contract != (found.row,)
            or spec.rhs_contract != (0,)
            or onehot.op != "aligned"
            or AlignedMap.op_key(onehot.attrs[0]) != "scatter-add"
            or onehot.args[1] is not found.perm
            or self.ev.uniform(onehot.args[0]) != 1
            or onehot.shape != (found.perm.shape[0],) * 2
            or found.dense.dtype != t.dtype
        ):
            return None
        order = [k for k in range(len(v.shape)) if k != found.row] + [found.row]
        if order == list(range(len(order))):
            return found.dense
        shape = Shape(t.dtype, tuple(found.dense.shape[k] for k in order))
        return self.ev.normal("transpose", (transpose_text(tuple(order)),), [found.dense], shape)

    def dense_of(self, value: Term, perm: Term, out: Term) -> Term | None:
        """The dense value of `value` when it holds rows along dim 0 permuted by `perm` (and has
        exactly `out`'s shape: every row is put back once)."""
        found = self.info(value)
        if found is None or found.perm is not perm or found.row != 0 or found.dense.shape != out.shape:
            return None
        return found.dense if found.dense.dtype == out.dtype else None

    def _row_gather(self, t: Term) -> tuple[Term, Term] | None:
        """(X, P) when `t` = X[P] along dim 0 (whole rows), P an argsort of a value of X's row count."""
        if not _gathers_rows(t):
            return None
        x, perm = t.args
        if self.argsort(perm) is None or x.shape[0] != perm.shape[0]:
            return None
        return x, perm

    def _gather_at_permuted(self, t: Term) -> Permuted | None:
        """X[V] with V = I[P] (whole rows of X at permuted indices) is X[I], permuted: the indices
        of a top-k dispatch (`repeat(arange(tokens), k)[P]`)."""
        if not _gathers_rows(t):
            return None
        x, idx = t.args
        found = self.info(idx)
        if found is None or found.row != 0 or len(found.dense.shape) != 1:
            return None
        rows = evaluate(self.ev, found.dense, {})
        shape = _shape(t)
        if rows is None:  # indices known only as a term: the same gather of the dense indices
            index = self.ev.reshape_term(found.dense, Shape(idx.dtype, idx.shape))
            dense = self.ev.mk("aligned", t.attrs, (x, index), shape)
        else:  # rows at constant indices: whole rows, each repeated k times (k = 1: X itself)
            m, k = x.shape[0], len(rows) // max(x.shape[0], 1)
            if m * k != len(rows) or not np.array_equal(rows, np.repeat(np.arange(m), k)):
                return None
            wide = broadcast_term(self.ev, x, Shape(x.dtype, (m, k, *x.shape[1:])), (0, *range(2, len(x.shape) + 1)))
            dense = self.ev.reshape_term(wide, shape)
        return Permuted(dense, 0, found.perm)

    # -- tracking --------------------------------------------------------------------------------
    def info(self, t: Term) -> Permuted | None:
        if t not in self.found:
            self.found[t] = None  # a DAG has no cycles; this guards re-entry
            self.found[t] = self._info(t)
        return self.found[t]

    def _info(self, t: Term) -> Permuted | None:
        if t.op == "aligned":
            if (gathered := self._row_gather(t)) is not None:
                return Permuted(gathered[0], 0, gathered[1])
            return self._sorted_keys(t) or self._gather_at_permuted(t)
        if t.op == "slice":
            inner = self.info(t.args[0])
            if inner is None or t.attrs[0] == inner.row:
                return None
            return Permuted(self.ev.mk("slice", t.attrs, (inner.dense,), _shape(t)), inner.row, inner.perm)
        if t.op == "bcast":
            return self._bcast(t)
        if t.op in ("transpose", "reshape"):
            return self._layout(t)
        if t.op in ELEMENTWISE:
            return self.segments(t) or self._elementwise(t)
        if t.op == "reduce":
            return self._reduce(t)
        if t.op == "dot":
            return self._dot(t)
        return None

    def _sorted_keys(self, t: Term) -> Permuted | None:
        """sort(v) = v[argsort(v)]: the values output of the same sort."""
        key = AlignedMap.op_key(t.attrs[0])
        if key != "sort:LT:0:0" or len(t.shape) != 1:
            return None
        perm = self.ev.mk("aligned", (t.attrs[0].replace("sort:LT:0:0", "sort:LT:0:1", 1),), t.args, _shape(t.args[1]))
        if self.argsort(perm) is None or t.dtype != t.args[0].dtype:
            return None
        return Permuted(t.args[0], 0, perm)

    def _bcast(self, t: Term) -> Permuted | None:
        inner = self.info(t.args[0])
        if inner is None:
            return None
        pairs = BcastSpec.parse(t.attrs[0]).operand_dims()
        row = next(o for o, k in pairs if k == inner.row)
        return Permuted(self.ev.mk("bcast", t.attrs, (inner.dense,), _shape(t)), row, inner.perm)

    def _layout(self, t: Term) -> Permuted | None:
        """A transpose, or a reshape that only inserts or drops unit dims, moves the row dim."""
        inner = self.info(t.args[0])
        if inner is None:
            return None
        if t.op == "transpose":
            row = parse_transpose(t.attrs[0]).index(inner.row)
        else:
            before = [k for k, size in enumerate(t.args[0].shape) if size != 1]
            after = [k for k, size in enumerate(t.shape) if size != 1]
            sizes = [t.args[0].shape[k] for k in before]
            if sizes != [t.shape[k] for k in after] or inner.row not in before:
                return None
            row = after[before.index(inner.row)]
        return Permuted(self.ev.mk(t.op, t.attrs, (inner.dense,), _shape(t)), row, inner.perm)

    def _elementwise(self, t: Term) -> Permuted | None:
        tracked = [(a, self.info(a)) for a in t.args]
        known = [p for _, p in tracked if p is not None]
        if not known or any((p.perm, p.row) != (known[0].perm, known[0].row) for p in known):
            return None
        row = known[0].row
        args = []
        for a, p in tracked:
            if p is None and not self.invariant(a, row):
                return None
            args.append(a if p is None else p.dense)
        return Permuted(self.ev.normal(t.op, t.attrs, args, _shape(t)), row, known[0].perm)

    def invariant(self, t: Term, row: int) -> bool:
        """`t` does not vary along dim `row`: a broadcast along it, or a constant uniform along it."""
        if t.op == "bcast" and BcastSpec.parse(t.attrs[0]).parts[row][0] == "n":
            return True
        value = self.ev.folded(t)
        return value is not None and bool(np.all(value == np.take(value, [0], axis=row)))

    def _reduce(self, t: Term) -> Permuted | None:
        inner = self.info(t.args[0])
        spec = ReduceSpec.parse(t.attrs[1])
        if inner is None or inner.row in spec.dims or len(t.args) != 1:
            return None
        row = inner.row - sum(d < inner.row for d in spec.dims)
        return Permuted(self.ev.mk("reduce", t.attrs, (inner.dense,), _shape(t)), row, inner.perm)

    def _dot(self, t: Term) -> Permuted | None:
        spec = DotSpec.parse(t.attrs[0])
        x, y = t.args
        px, py = self.info(x), self.info(y)
        if (px is None) == (py is None):
            return None
        lhs_free = [k for k in range(len(x.shape)) if k not in spec.lhs_batch + spec.lhs_contract]
        rhs_free = [k for k in range(len(y.shape)) if k not in spec.rhs_batch + spec.rhs_contract]
        if px is not None:
            if px.row not in lhs_free:
                return None
            row, args, perm = len(spec.lhs_batch) + lhs_free.index(px.row), (px.dense, y), px.perm
        else:
            assert py is not None
            if py.row not in rhs_free:
                return None
            row = len(spec.lhs_batch) + len(lhs_free) + rhs_free.index(py.row)
            args, perm = (x, py.dense), py.perm
        return Permuted(self.ev.normal("dot", t.attrs, args, _shape(t)), row, perm)

    # -- segment bounds --------------------------------------------------------------------------
    def segments(self, t: Term) -> Permuted | None:
        """and(starts[e] <= b, b < ends[e]) over the groups of a sorted v: (v[t] == e), permuted."""
        if t.op != "binary" or t.attrs[0] != "and":
            return None
        sides = [side for c in t.args if (side := _ordered(c)) is not None]
        if len(sides) != 2:
            return None
        (lo, op1, b1), (b2, op2, hi) = sorted(sides, key=lambda s: s[1] != "LE")
        if (op1, op2) != ("LE", "LT") or b1 is not b2:
            return None
        row = self._iota_dim(b1)
        starts, ends = self._group_dim(lo), self._group_dim(hi)
        if row is None or starts is None or ends is None or starts[0] != ends[0]:
            return None
        group, s, e = starts[0], starts[1], ends[1]
        counts = self.cumsum_of(e)
        if counts is None or not self.starts_of(s, e, counts):
            return None
        counted = self.bincount_of(counts)
        if counted is None:
            return None
        # the sort's keys: the counted value, or (bincount ignores the order) that value flattened
        perms = [
            p
            for keys, ps in self.sorts.items()
            if keys is counted or (keys.op == "reshape" and keys.args[0] is counted and len(keys.shape) == 1)
            for p in ps
            if p.shape[0] == t.shape[row]
        ]
        if len(perms) != 1:
            return None
        keys = perms[0].args[0]
        shape = Shape(keys.dtype, t.shape)
        one_hot = self.ev.normal(
            "binary",
            (compare_text("EQ", keys.dtype),),
            (
                broadcast_term(self.ev, keys, shape, (row,)),
                broadcast_term(self.ev, self.ev.const(np.arange(counts.shape[0]), keys.dtype), shape, (group,)),
            ),
            _shape(t),
        )
        return Permuted(one_hot, row, perms[0])

    def _one_hot_sum(self, counts: Term) -> Term | None:
        """w when counts[e] = sum over w's dims of (w == e): the one-hot of w along a last dim, summed."""
        summed = reduced_over(counts)
        if summed is None or summed[0] != "add":
            return None
        _, inner, dims = summed
        rank = len(inner.shape)
        if dims != tuple(range(rank - 1)):
            return None
        if inner.op == "unary" and inner.attrs[0] == "convert":
            inner = inner.args[0]
        parsed = parse_compare(inner.attrs[0]) if inner.op == "binary" else None
        if parsed is None or parsed[0] != "EQ":
            return None
        for w, iota in (inner.args, inner.args[::-1]):
            if self._iota_dim(iota) == rank - 1 and w.op == "bcast" and _keeps_leading(w):
                return w.args[0]
        return None

    def _iota_dim(self, b: Term) -> int | None:
        """d when `b` is a constant with b[..., i, ...] = i along dim d (an arange broadcast)."""
        value = self.ev.folded(b)
        if value is None or value.shape != b.shape:
            return None
        for d, size in enumerate(b.shape):
            expected = np.arange(size).reshape([-1 if k == d else 1 for k in range(len(b.shape))])
            if size > 1 and np.array_equal(value, np.broadcast_to(expected, b.shape)):
                return d
        return None

    def _group_dim(self, t: Term) -> tuple[int, Term] | None:
        """(d, g) when `t` is a 1-D g broadcast along dim d."""
        if t.op != "bcast" or len(t.args[0].shape) != 1:
            return None
        pairs = BcastSpec.parse(t.attrs[0]).operand_dims()
        return (pairs[0][0], t.args[0]) if len(pairs) == 1 else None

    def cumsum_of(self, ends: Term) -> Term | None:
        """C when `ends` is the inclusive cumsum of a 1-D C (a window sum of size n, padded n - 1 in front)."""
        window = self.ev.window_sums.get(ends)
        n = ends.shape[0]
        if window is None or len(ends.shape) != 1 or window != ([n], [(n - 1, 0)]):
            return None
        return ends.args[0]

    def starts_of(self, starts: Term, ends: Term, counts: Term) -> bool:
        """starts = ends - counts, or [0, ends[:-1]]."""
        if starts.op == "binary" and starts.attrs[0] == "subtract" and starts.args == (ends, counts):
            return True
        if starts.op != "concat" or starts.attrs[0] != 0 or len(starts.args) != 2:
            return False
        head, tail = starts.args
        zero = self.ev.folded(head)
        n = ends.shape[0]
        return (
            zero is not None
            and zero.shape == (1,)
            and zero.item() == 0
            and tail.op == "slice"
            and tail.attrs == (0, 0, n - 1)
            and tail.args[0] is ends
        )

    def bincount_of(self, counts: Term) -> Term | None:
        """v when `counts` = bincount(v) over [0, E), every v in [0, E): a scatter-add of ones into
        zeros at g(v), g elementwise with g(k) = k on v's range (the index's clip and wrap), or the
        one-hot of v summed over v's dims."""
        if len(counts.shape) != 1:
            return None
        if self.ev.row_scatters.get(counts) != "add":
            counted = self._one_hot_sum(counts)
            bounds = None if counted is None else _bounds(self.ev, counted)
            if bounds is None or bounds[0] < 0 or bounds[1] >= counts.shape[0]:
                return None
            return counted
        zeros, idx, ones = counts.args
        z, o = self.ev.folded(zeros), self.ev.folded(ones)
        if z is None or o is None or np.any(z != 0) or np.any(o != 1) or idx.op != "reshape":
            return None
        g = idx.args[0]
        keys = _elementwise_leaf(self.ev, g)
        bounds = None if keys is None else self.ev.bounds_of(keys)
        if keys is None or bounds is None or keys.shape != g.shape or len(keys.shape) != 1:
            return None
        lo, hi = int(bounds[0]), int(bounds[1])
        if lo < 0 or hi >= counts.shape[0]:
            return None
        for k in range(lo, hi + 1):
            at_k = evaluate(self.ev, g, {keys: np.full(keys.shape, k, dtype=NP_DTYPES.get(keys.dtype, np.int64))})
            if at_k is None or np.any(at_k != k):
                return None
        return keys


def _bounds(ev: Builder, t: Term) -> tuple[float, float] | None:
    """Bounds of t's elements, also through slices and reshapes (which keep some of them)."""
    while (found := ev.bounds_of(t)) is None and t.op in ("slice", "reshape"):
        t = t.args[0]
    return found


def _keeps_leading(w: Term) -> bool:
    """w broadcasts its operand along one new last dim, its own dims in order in front."""
    rank = len(w.shape) - 1
    return BcastSpec.parse(w.attrs[0]).operand_dims() == [(k, k) for k in range(rank)] and len(w.args[0].shape) == rank


def _gathers_rows(t: Term) -> bool:
    """`t` is a gather of whole rows of its operand (dim 0) at indices [n] (the normal form's
    implicit one-coordinate index vector)."""
    op_key = AlignedMap.op_key(t.attrs[0])
    if not op_key.startswith("gather:"):
        return False
    x, idx = t.args
    dims = GatherDims.from_key(op_key)
    return (
        dims.collapsed == (0,)
        and dims.start_map == (0,)
        and not dims.operand_batch
        and dims.vector_dim == 1
        and dims.offset == tuple(range(1, len(x.shape)))
        and dims.slice_sizes == (1, *x.shape[1:])
        and idx.shape == (t.shape[0],)
        and t.shape[1:] == x.shape[1:]
    )


def _elementwise_leaf(ev: Builder, g: Term) -> Term | None:
    """The one non-constant leaf of `g` when `g` is built from it by elementwise ops and constants
    only (so g's element i depends on the leaf's element i alone), else None."""
    leaves: set[Term] = set()
    stack, seen = [g], set()
    while stack:
        t = stack.pop()
        if id(t) in seen or ev.folded(t) is not None:
            continue
        seen.add(id(t))
        if t.op in ELEMENTWISE and t.shape == g.shape:
            stack.extend(t.args)
        else:
            leaves.add(t)
    return next(iter(leaves)) if len(leaves) == 1 else None


def _ordered(c: Term) -> tuple[Term, str, Term] | None:
    """A compare as (a, LE or LT, b): a <= b or a < b."""
    parsed = parse_compare(c.attrs[0]) if c.op == "binary" else None
    if parsed is None:
        return None
    direction, (a, b) = parsed[0], c.args
    flipped = {"GE": "LE", "GT": "LT"}
    if direction in flipped:
        return b, flipped[direction], a
    return (a, direction, b) if direction in ("LE", "LT") else None


def _shape(t: Term) -> Shape:
    return Shape(t.dtype, t.shape)
