"""Numeric localization: both programs' values on the same random inputs, where the proof cannot decide.

The verifier's terms are both programs over the reference inputs. Evaluated on one random draw
(the numeric oracle's seed 0 and integer ranges, so the inputs of the counterexample), each
distributed value on each device either equals a window of some reference value or input (a
shard, or a copy; also with unit dims dropped, and one group of a value vmapped over groups), or
its sum over the devices of one mesh axis does (a partial sum awaiting its all-reduce), or it
matches nothing. From the op where the proof stops (before it every value is proved related), the
first distributed op whose value matches nothing on some device, and from which no matching value
is computed later (a difference masked out or summed away is none), is the numeric frontier: the
proof's finding should agree with it, and where the proof only could not relate a value that
does not differ yet, it lacked a rule there. Index arithmetic and values no input reaches are
not compared (the reference holds no counterpart: the values they index are compared), nor values
that may be windows of a reference value numerics cannot evaluate.

Cost: every term is evaluated once (numpy) and each value is compared with the reference values
of its dtype and rank; models past `numeric_terms` terms or `numeric_elements` input elements
(equivci.options.Budgets) are skipped.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable

import numpy as np

from equivci.capture.oracle import Ranges, draw_leaves, tolerance_for
from equivci.capture.types import LeafPlacement
from equivci.diagnose.arguments import INDEX_TYPES
from equivci.diagnose.frames import LAYOUT_OPS
from equivci.hlo.ir import TRIVIAL_OPS, Instruction
from equivci.options import Budgets
from equivci.terms.ir import Term
from equivci.terms.semantics import TermEvalError, evaluate
from equivci.translate.evaluator import Event


@dataclasses.dataclass(frozen=True)
class NumericFrontier:
    """`event`: the first distributed op whose value matches no reference value (None: every
    compared value matches); `note`: why the comparison was skipped, when it was."""

    event: Event | None
    device: int = 0
    compared: int = 0
    note: str | None = None
    # The value at the comparison's start (the proof's stop), or one computed from it, matches a
    # reference value: the stop is no difference numerics can see.
    start_matches: bool = False
    # A value that is a partial sum over this mesh axis (its sum over the axis matches a reference
    # value, it alone none) from which no value matching a reference value is computed, but the
    # differing op (second) is: its all-reduce is missing, and what it feeds uses it as the full value.
    partial: tuple[Event, str, Event] | None = None
    # The first differing value is not computed from the proof's stop: a difference of its own, which
    # the stop (an index numerics does not compare, a value it matches) cannot account for.
    apart: bool = False
    # An all-reduce over the partial sum's axis that sums the op using it (`psum(partial + full)`):
    # the all-reduce is there, and the use's other operand, the same on every device, is summed too.
    reduced_after: Event | None = None


MAX_DIFFERING = 16  # values that match nothing followed to the values computed from them
SUMMED = 1 << 16  # marks of partial sums among what a value is computed from, past differing ones
START = -1  # the comparison's start among what a value is computed from
RELAYOUTS = {"broadcast", "reshape", "transpose"}  # ops that move elements and compute none


def draw_inputs(
    inputs: tuple[LeafPlacement, ...], seed: int = 0, ranges: Ranges | None = None
) -> dict[int, np.ndarray]:
    """The oracle's random draw for these input leaves (same leaf order, same per-leaf keys), its
    integer inputs inside `ranges` (equivci.verify.engine.oracle_ranges: those the proof assumed
    valid indices), as the oracle draws them: a value at a position outside them is no input."""
    leaves = tuple((tuple(leaf.shape), leaf.dtype) for leaf in inputs)
    return dict(_draw(leaves, seed, tuple(sorted((ranges or {}).items()))))


@functools.lru_cache(maxsize=1)
def _draw(
    leaves: tuple[tuple[tuple[int, ...], str], ...], seed: int, ranges: tuple[tuple[int, tuple[int, int]], ...]
) -> dict[int, np.ndarray]:
    """One draw per verification, however many stages ask for it (the window candidates, numeric
    localization). Read-only: the stages share the arrays."""
    drawn = dict(enumerate(draw_leaves(seed, leaves, dict(ranges))))
    for value in drawn.values():
        value.setflags(write=False)
    return drawn


class _Values:
    """Term values on one draw, memoized; None for terms the interpreter cannot evaluate."""

    def __init__(self, params: dict[int, np.ndarray], consts: dict):
        self.params, self.consts = params, consts
        self.memo: dict[int, np.ndarray] = {}
        self.failed: set[int] = set()
        self.reads: dict[int, bool] = {}  # id(term) -> it depends on an input

    def __call__(self, t: Term) -> np.ndarray | None:
        if id(t) in self.failed:
            return None
        try:
            return evaluate(t, self.params, self.consts, self.memo)
        except (TermEvalError, KeyError, ValueError, TypeError, IndexError):
            self.failed.add(id(t))
            return None

    def reads_input(self, term: Term) -> bool:
        """`term` depends on an input leaf (a value folded to a constant, or made of constants
        only, does not: a device's offsets and masks, which the values they index are judged by)."""
        stack = [term]
        while stack:
            t = stack[-1]
            if id(t) in self.reads:
                stack.pop()
                continue
            if t.op == "param" or t in self.consts or not t.args:
                self.reads[id(t)] = t.op == "param"
                stack.pop()
                continue
            missing = [a for a in t.args if id(a) not in self.reads]
            if missing:
                stack.extend(missing)
                continue
            self.reads[id(t)] = any(self.reads[id(a)] for a in t.args)
            stack.pop()
        return self.reads[id(term)]


# What `far_apart` calls apart: a difference of this share of the values' size is no rounding.
APART = 0.1
_DRAWN = {"f16": np.float16, "f32": np.float32, "f64": np.float64}


def far_apart(pairs: list[tuple[Term, Term]], consts: dict) -> bool:
    """Some pair's two terms differ by far more than rounding on one draw of their inputs (numpy,
    standard normal, seed 0): no proof can make them equal, so a what-if that needs them equal is
    not worth its saturation. False when it cannot tell: an input that is no float (an index
    needs its valid range, which the oracle's draw knows), a term the interpreter cannot evaluate,
    or a value that is not finite."""
    leaves: dict[int, Term] = {}
    seen: set[int] = set()
    stack = [t for pair in pairs for t in pair]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.op == "param":
            leaves[t.attrs[0]] = t
        elif t not in consts:
            stack.extend(t.args)
    if any(t.dtype not in _DRAWN for t in leaves.values()):
        return False
    rng = np.random.default_rng(0)
    values = _Values(
        {k: rng.standard_normal(t.shape).astype(_DRAWN[t.dtype]) for k, t in sorted(leaves.items())}, consts
    )
    for a, b in pairs:
        x, y = values(a), values(b)
        if x is None or y is None or x.shape != y.shape or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            continue
        x, y = x.astype(np.float64), y.astype(np.float64)
        scale = max(float(np.max(np.abs(x), initial=0.0)), float(np.max(np.abs(y), initial=0.0)), 1.0)
        if float(np.max(np.abs(x - y), initial=0.0)) > APART * scale:
            return True
    return False


def _tolerance(dtype) -> tuple[float, float]:
    try:
        tol = tolerance_for(dtype)
    except TypeError:
        return 0.0, 0.0
    return tol.rtol, tol.atol


class _ReferenceIndex:
    """The reference values by (dtype, rank), to find the one a distributed value is a window of.

    The distributed program computes in about the reference's order, so the search prefers the
    reference value nearest the last match: of the values that match, the one a search outwards
    from the last match's position meets first (that one, the one before, the one after, two
    before, ...). Values of one shape are compared in one stacked comparison: a value that matches
    nothing is compared with all of them per shape, not in one call each."""

    def __init__(self) -> None:
        self.by_kind: dict[tuple, list[np.ndarray]] = {}
        self.positions: dict[tuple, list[int]] = {}
        self.near = 0  # program position of the last reference value matched
        # (dtype, rank) -> reference shape -> (the values' ordinals in by_kind, their stack)
        self._stacks: dict[tuple, dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]]] = {}

    def add(self, value: np.ndarray, position: int = 0) -> None:
        # A value is also kept without its unit dims: `x[:, None, :]` (a reshape that only adds a
        # unit dim, as for a dynamic-update-slice's update) holds the same data as x. And with its
        # two leading dims as one: a reference vmapped over groups computes [G, S, ...] where a
        # device computes one group's [S, ...], rows S*g to S*(g+1) of the merged value.
        forms = [value] + [np.squeeze(value)] * (1 in value.shape)
        if value.ndim >= 3:
            forms.append(value.reshape((-1,) + value.shape[2:]))
        for v in forms:
            if v.size:
                key = (v.dtype.str, v.ndim)
                self.by_kind.setdefault(key, []).append(v)
                self.positions.setdefault(key, []).append(position)
                self._stacks.pop(key, None)

    def matches(self, a: np.ndarray) -> bool:
        if a.size == 0:
            return True
        return self._matches(a) or (1 in a.shape and self._matches(np.squeeze(a)))

    def _stacked(self, key: tuple) -> dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]]:
        if key not in self._stacks:
            ordinals: dict[tuple[int, ...], list[int]] = {}
            for k, r in enumerate(self.by_kind.get(key, [])):
                ordinals.setdefault(r.shape, []).append(k)
            values = self.by_kind.get(key, [])
            self._stacks[key] = {
                shape: (np.array(ks), np.stack([values[k] for k in ks])) for shape, ks in ordinals.items()
            }
        return self._stacks[key]

    def _matches(self, a: np.ndarray) -> bool:
        rtol, atol = _tolerance(a.dtype)
        # The absolute tolerance scales with the value's own magnitude: a candidate's (an exp
        # that overflows to 1e30) would let it match anything.
        finite = np.abs(a[np.isfinite(a)]) if a.dtype.kind in "fc" else None
        scale = max(1.0, float(finite.max())) if finite is not None and finite.size else 1.0
        key = (a.dtype.str, a.ndim)
        positions = self.positions.get(key, [])
        start = bisect.bisect_left(positions, self.near)
        best: int | None = None
        for shape, (ks, stack) in self._stacked(key).items():
            if any(n < m or n % m for m, n in zip(a.shape, shape)):
                continue
            # Chunks bound the comparison's memory whatever the number of values of one shape.
            step = max(1, _CHUNK_ELEMENTS // max(1, stack[0].size))
            for lo in range(0, len(ks), step):
                tiles = _tiles(stack[lo : lo + step], a.shape)
                close = np.isclose(tiles, a, rtol=rtol, atol=atol * scale, equal_nan=True)
                hit = ks[lo : lo + step][close.reshape(tiles.shape[:2] + (-1,)).all(axis=2).any(axis=1)]
                if hit.size:
                    k = min(hit.tolist(), key=lambda k: _distance(k, start))
                    best = k if best is None or _distance(k, start) < _distance(best, start) else best
        if best is None:
            return False
        self.near = positions[best]
        return True


# Elements compared at once (a chunk of stacked reference values of one shape).
_CHUNK_ELEMENTS = 1 << 22


def _distance(k: int, start: int) -> int:
    """Rank of ordinal k in the search outwards from `start`: start, start - 1, start + 1, ..."""
    return 2 * (k - start) if k >= start else 2 * (start - 1 - k) + 1


def _tiles(stack: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Each value of `stack` cut into blocks of `shape` (a grid: shards are blocks), as
    [values, blocks, *shape]."""
    split = [d for m, n in zip(shape, stack.shape[1:]) for d in (n // m, m)]
    ndim = len(shape)
    axes = [0] + [1 + a for a in list(range(0, 2 * ndim, 2)) + list(range(1, 2 * ndim, 2))]
    blocks = stack.reshape([len(stack)] + split).transpose(axes)
    return blocks.reshape((len(stack), -1) + tuple(shape))


def numeric_frontier(
    reference_events: list[Event],
    distributed_events: list[Event],
    consts: dict,
    inputs: tuple[LeafPlacement, ...],
    groups_by_axis: dict[str, list[list[int]]],
    term_count: int,
    routed: frozenset[int] | set[int] = frozenset(),
    budgets: Budgets = Budgets(),
    ranges: Ranges | None = None,
    start: Instruction | None = None,
) -> NumericFrontier:
    """The first distributed op, from `start` (the proof's stop) on, whose value is no window of
    any reference value, on any device. `routed`: ids of MoE dispatch masks and routed rows
    (related only through their combine); `ranges`: the integer inputs' ranges the oracle draws
    in (see draw_inputs)."""
    if term_count > budgets.numeric_terms:
        return NumericFrontier(
            None, note=f"numeric localization skipped: {term_count} terms (limit {budgets.numeric_terms})"
        )
    if sum(math.prod(leaf.shape) for leaf in inputs) > budgets.numeric_elements:
        return NumericFrontier(
            None, note=f"numeric localization skipped: inputs over {budgets.numeric_elements} elements"
        )
    try:
        params = draw_inputs(inputs, ranges=ranges)
    except Exception as exc:  # noqa: BLE001 - an aid to the finding: its failure must not cost the verdict
        return NumericFrontier(None, note=f"numeric localization skipped: the random inputs could not be drawn ({exc})")
    values = _Values(params, consts)
    groups_by_axis = with_axis_sets(groups_by_axis)
    index = _ReferenceIndex()
    for k in sorted(params):
        # The inputs are the reference's values too: a gathered copy of a sharded input matches one.
        index.add(params[k])
    reference_ids = set()
    unknown: set[tuple[str, tuple[int, ...]]] = set()  # (dtype, shape) of reference values without one
    for position, e in enumerate(reference_events):
        v = e.values[0]
        if isinstance(v, Term) and id(v) not in reference_ids:
            reference_ids.add(id(v))
            found = values(v)
            if found is not None:
                index.add(found, position)
            else:
                unknown.add((v.dtype, v.shape))
    # id(term) -> how it matches: None in full, the mesh axis it is a partial sum over, "" not at all
    verdict: dict[int, str | None] = {}
    compared = 0
    # Values that match nothing, in program order, as (event, device); `upstream`: by op name, those
    # its value is computed from; `absorbed`: those a value that matches is computed from.
    differing: list[tuple[Event, int]] = []
    # Values matching only as partial sums, as (event, axis), marked SUMMED + k upstream; `completed`:
    # the marks of those a value matching in full (after its all-reduce) is computed from.
    pending: list[tuple[Event, str]] = []
    completed: set[int] = set()
    differing_reads: list[frozenset[int]] = []
    upstream: dict[str, frozenset[int]] = {}
    made_by: dict[int, str] = {}  # id(term) -> the op that last gave it
    absorbed: set[int] = set()
    repeated: set[str] = set()  # ops that only repeat or relabel values that match (see _repeats)

    def _matches(t: Term) -> bool:
        """`t` is a reference value, or matches one."""
        found = values(t) if id(t) not in reference_ids else None
        return id(t) in reference_ids or (found is not None and index.matches(found))

    # Before the proof's stop every value is proved related to the reference (a rescaled or routed
    # one numerics cannot match is no difference): the comparison starts there.
    begin = next((k for k, e in enumerate(distributed_events) if e.inst is start), 0)
    for event in distributed_events[begin:]:
        inst, terms = event.inst, event.values
        reads = frozenset().union(*(upstream.get(name.split("#")[0], frozenset()) for name in inst.operands))
        if any(name.split("#")[0] not in upstream for name in inst.operands):
            # An operand bound by a call (a parameter of a shard_map body) is no op of the program:
            # its terms, the call's operands', say what it is computed from.
            args = (id(a) for t in terms if isinstance(t, Term) for a in t.args)
            reads |= frozenset().union(*(upstream.get(made_by.get(a, ""), frozenset()) for a in args))
        reads |= {START} if inst is start else frozenset()
        upstream[inst.name] = reads
        made_by.update((id(t), inst.name) for t in terms if isinstance(t, Term))
        if inst.opcode in TRIVIAL_OPS or any(not isinstance(t, Term) or id(t) in routed for t in terms):
            continue
        if inst.shape.dtype in INDEX_TYPES or not any(values.reads_input(t) for t in terms):
            # Index arithmetic (an offset from the device index, a vocabulary shard's mask, ids
            # shifted into a shard) and values no input reaches (a position table) have no
            # counterpart the reference must hold: the values they shift, mask or select are
            # compared, and those differ where they are wrong.
            continue
        evaluated = [values(t) for t in terms]
        arrays = [a for a in evaluated if a is not None]
        if len(arrays) < len(evaluated):
            continue
        compared += 1
        for dev, (t, a) in enumerate(zip(terms, arrays)):
            if id(t) not in verdict:
                full = id(t) in reference_ids or index.matches(a)
                verdict[id(t)] = None if full else _partial(index, arrays, dev, groups_by_axis)
        differs = next((dev for dev, t in enumerate(terms) if verdict[id(t)] == ""), None)
        if differs is None and all(a.size > 1 and (a == a.flat[0]).all() for a in arrays):
            # Elements all equal (a fully masked shard's maximum, -1e9) match any tile of equal
            # elements: no evidence that the value is right.
            continue
        if differs is not None and _repeats(inst, terms, repeated, _matches):
            # A broadcast (or a unit-dim reshape) repeats the elements of a value that matches (a
            # kernel row over every position): it computes nothing wrong itself; the op that uses
            # it is compared, and differs where the repeated value is the wrong one to use.
            repeated.add(inst.name)
            continue
        if differs is not None and _undecided(terms[differs], unknown):
            # It may be a window of a reference value numerics could not evaluate (an op without
            # a numpy model): no evidence either way.
            continue
        if differs is None:
            # What a matching value is computed from differed only where it was masked out or
            # summed away (a vocabulary shard's rows outside the shard, a piece of a sum).
            absorbed |= reads
            summed_over = sorted({axis for t in terms if (axis := verdict[id(t)])})
            if not summed_over:
                completed.update(reads)
            elif len(pending) < MAX_DIFFERING:
                upstream[inst.name] = reads | {SUMMED + len(pending)}
                pending.append((event, summed_over[0]))
        elif len(differing) < MAX_DIFFERING:
            upstream[inst.name] = reads | {len(differing)}
            differing.append((event, differs))
            differing_reads.append(reads)
    lead = next((k for k in range(len(differing)) if k not in absorbed), None)
    if lead is None:
        return NumericFrontier(None, 0, compared, start_matches=START in absorbed)
    by_name = {e.inst.name: e for e in distributed_events}

    def made(event: Event, axis: str) -> Event:
        """Back through operands that are partial sums over `axis` too (the comparison may start
        after them, at the proof's stop): the op that made the partial sum."""
        for _ in range(MAX_DIFFERING):
            before = [by_name.get(n.split("#")[0]) for n in event.inst.operands]
            found = next((e for e in before if e is not None and partial_over(e, axis)), None)
            if found is None:
                return event
            event = found
        return event

    def partial_over(event: Event, axis: str) -> bool:
        if event.inst.opcode in TRIVIAL_OPS or not all(isinstance(t, Term) for t in event.values):
            return False
        arrays = [a for t in event.values if (a := values(t)) is not None]
        return len(arrays) == len(event.values) and all(
            _partial(index, arrays, dev, {axis: groups_by_axis[axis]}) for dev in range(len(arrays))
        )

    unreduced = next(
        (
            (made(summed, axis), axis, use, m)
            for k, (summed, axis) in enumerate(pending)
            if SUMMED + k not in completed
            for (use, _), reads, m in zip(differing, differing_reads, itertools.count())
            if m not in absorbed and SUMMED + k in reads and use.inst.opcode not in LAYOUT_OPS
        ),
        None,
    )
    reduced_after = None
    if unreduced is not None:
        _, axis, use, m = unreduced
        reduced_after = next(
            (
                e
                for (e, _), reads in zip(differing, differing_reads)
                if e.inst.opcode == "all-reduce" and m in reads and _sums(values, e, use, groups_by_axis[axis])
            ),
            None,
        )
    # A difference that meets the stop later (a select of gathered rows by the stop's ownership
    # test, a dot with the stop's mask) may be the stop's doing: it decides which elements stay.
    apart = (
        start is not None
        and any(e.inst is start for e in distributed_events)
        and START not in differing_reads[lead]
        and not any(lead in reads and START in reads for reads in upstream.values())
    )
    return NumericFrontier(
        *differing[lead],
        compared,
        start_matches=START in absorbed,
        partial=unreduced[:3] if unreduced is not None else None,
        apart=apart,
        reduced_after=reduced_after,
    )


def _sums(values: Callable[[Term], np.ndarray | None], total: Event, piece: Event, groups: list[list[int]]) -> bool:
    """`total`'s value on every device is the sum of `piece`'s over the devices of its group: the
    all-reduce over these groups of that value (what reaches it in between only relays it)."""
    totals = [a for t in total.values if isinstance(t, Term) and (a := values(t)) is not None]
    pieces = [a for t in piece.values if isinstance(t, Term) and (a := values(t)) is not None]
    if not len(totals) == len(pieces) == len(total.values) == len(piece.values):
        return False
    for group in groups:
        if any(d >= len(pieces) or pieces[d].shape != totals[d].shape for d in group):
            return False
        with np.errstate(over="ignore", invalid="ignore"):
            expected = np.sum([pieces[d] for d in group], axis=0)
        scale = 1e-5 * (1.0 + float(np.nanmax(np.abs(expected), initial=0.0)))
        if not all(np.allclose(totals[d], expected, rtol=1e-4, atol=scale, equal_nan=True) for d in group):
            return False
    return True


def with_axis_sets(groups_by_axis: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
    """The device groups of every set of mesh axes, by their names joined: a partial sum may await
    one all-reduce over several axes at once (`psum(x, ("x", "y"))`, the devices of a plane)."""
    names = sorted(groups_by_axis)
    found = dict(groups_by_axis)
    for size in range(2, len(names) + 1):
        for axes in itertools.combinations(names, size):
            group_of = {d: frozenset(g) for g in groups_by_axis[axes[0]] for d in g}
            for axis in axes[1:]:
                along = {d: g for g in groups_by_axis[axis] for d in g}
                # The mesh is a grid: stepping along one axis from every device of the group so far.
                group_of = {
                    d: frozenset().union(*(along.get(e, frozenset({e})) for e in g)) for d, g in group_of.items()
                }
            found[",".join(axes)] = [list(g) for g in sorted({tuple(sorted(g)) for g in group_of.values()})]
    return found


def _repeats(inst: Instruction, terms: list, repeated: set[str], matches: Callable[[Term], bool]) -> bool:
    """`inst` repeats or relabels the elements of values that match (`matches`): a broadcast of
    them, a reshape that only adds or drops unit dims, or a re-layout of such an op's value."""
    operands = [name.split("#")[0] for name in inst.operands]
    if operands and all(name in repeated for name in operands):
        return inst.opcode in RELAYOUTS
    unit = inst.opcode == "reshape" and all(t.args and _squeezed(t.shape) == _squeezed(t.args[0].shape) for t in terms)
    return (inst.opcode == "broadcast" or unit) and all(t.args and all(matches(a) for a in t.args) for t in terms)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _undecided(term: Term, unknown: set[tuple[str, tuple[int, ...]]]) -> bool:
    """`term` could be a block of a reference value of these (dtype, shape), also without unit dims."""
    return any(
        dtype == term.dtype
        and any(
            len(a) == len(r) and all(n % m == 0 for m, n in zip(a, r) if m)
            for a, r in ((term.shape, shape), (_squeezed(term.shape), _squeezed(shape)))
        )
        for dtype, shape in unknown
    )


def _partial(
    index: _ReferenceIndex, arrays: list[np.ndarray], dev: int, groups_by_axis: dict[str, list[list[int]]]
) -> str:
    """The mesh axis over whose devices the sum matches (a partial sum awaiting its all-reduce), or "".
    Pieces equal on every device of the axis are no partial sum: they are one value replicated
    there, and its sum over the axis is that value times the axis size (a mean taken where a sum
    was due, a sum scaled down by the axis size)."""
    for axis, groups in groups_by_axis.items():
        group = next((g for g in groups if dev in g), None)
        if group is None or len(group) < 2 or any(arrays[d].shape != arrays[dev].shape for d in group):
            continue
        if all(np.array_equal(arrays[d], arrays[dev]) for d in group):
            continue
        if arrays[dev].dtype.kind not in "fc":
            continue
        with np.errstate(over="ignore", invalid="ignore"):  # masked fills (finfo.min) summed overflow
            total = np.sum([arrays[d] for d in group], axis=0)
        if index.matches(total):
            return axis
    return ""
