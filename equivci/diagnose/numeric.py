"""Numeric localization: both programs' values on the same random inputs, where the proof cannot decide.

The verifier's terms are both programs over the reference inputs. Evaluated on one random draw
(the numeric oracle's seed 0, so the inputs of the counterexample), each distributed value on each
device either equals a window of some reference value (a shard, or a copy), or its sum over the
devices of one mesh axis does (a partial sum awaiting its all-reduce), or it matches nothing. The
first distributed op, in program order, whose value matches nothing on some device is the numeric
frontier: the proof's finding should agree with it, and where the proof's first unrelated op
matches the reference numerically, the proof only lacked a rule there.

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

import numpy as np

from equivci.capture.oracle import random_inputs, tolerance_for
from equivci.capture.types import LeafPlacement
from equivci.hlo.ir import TRIVIAL_OPS
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


# Set in the verifier's forked child when its parent had jax loaded (a test, an application embedding
# equivci; the CLI never does): jax's runtime does not survive a fork, its threads are gone, and
# drawing inputs with it there hangs the child.
JAX_FORKED = False


def draw_inputs(inputs: tuple[LeafPlacement, ...], seed: int = 0) -> dict[int, np.ndarray]:
    """The oracle's random draw for these input leaves (same leaf order, same per-leaf keys)."""
    return dict(_draw(tuple((tuple(leaf.shape), leaf.dtype) for leaf in inputs), seed))


@functools.lru_cache(maxsize=1)
def _draw(leaves: tuple[tuple[tuple[int, ...], str], ...], seed: int) -> dict[int, np.ndarray]:
    """One draw per verification, however many stages ask for it (the window candidates, numeric
    localization): jax compiles its random functions per shape, which costs seconds on a big
    model. The arrays are read-only views of jax's, so sharing them is safe."""
    # lazy: jax is heavy; the CLI's parent process must not import it
    import jax

    drawn = random_inputs(tuple(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in leaves), seed)
    return {k: np.asarray(v) for k, v in enumerate(drawn)}


class _Values:
    """Term values on one draw, memoized; None for terms the interpreter cannot evaluate."""

    def __init__(self, params: dict[int, np.ndarray], consts: dict):
        self.params, self.consts = params, consts
        self.memo: dict[int, np.ndarray] = {}
        self.failed: set[int] = set()

    def __call__(self, t: Term) -> np.ndarray | None:
        if id(t) in self.failed:
            return None
        try:
            return evaluate(t, self.params, self.consts, self.memo)
        except (TermEvalError, KeyError, ValueError, TypeError, IndexError):
            self.failed.add(id(t))
            return None


def _tolerance(dtype) -> tuple[float, float]:
    try:
        tol = tolerance_for(dtype)
    except TypeError:
        return 0.0, 0.0
    return tol.rtol, tol.atol


class _ReferenceIndex:
    """The reference values by (dtype, rank), to find the one a distributed value is a window of.

    The distributed program computes in about the reference's order, so the search starts at the
    reference value the last match found and moves outwards: most values match within a few
    tries instead of a scan of the whole model."""

    def __init__(self):
        self.by_kind: dict[tuple, list[np.ndarray]] = {}
        self.positions: dict[tuple, list[int]] = {}
        self.near = 0  # program position of the last reference value matched

    def add(self, value: np.ndarray, position: int = 0) -> None:
        if value.size:
            key = (value.dtype.str, value.ndim)
            self.by_kind.setdefault(key, []).append(value)
            self.positions.setdefault(key, []).append(position)

    def matches(self, a: np.ndarray) -> bool:
        if a.size == 0:
            return True
        rtol, atol = _tolerance(a.dtype)
        # The absolute tolerance scales with the value's own magnitude: a candidate's (an exp
        # that overflows to 1e30) would let it match anything.
        finite = np.abs(a[np.isfinite(a)]) if a.dtype.kind in "fc" else None
        scale = max(1.0, float(finite.max())) if finite is not None and finite.size else 1.0
        key = (a.dtype.str, a.ndim)
        values, positions = self.by_kind.get(key, []), self.positions.get(key, [])
        start = bisect.bisect_left(positions, self.near)
        after, before = range(start, len(values)), range(start - 1, -1, -1)
        for k in (k for pair in itertools.zip_longest(after, before) for k in pair if k is not None):
            r = values[k]
            if any(n < m or n % m for m, n in zip(a.shape, r.shape)):
                continue
            tiles = _tiles(r, a.shape)
            close = np.isclose(tiles, a, rtol=rtol, atol=atol * scale, equal_nan=True)
            if close.reshape(len(tiles), -1).all(axis=1).any():
                self.near = positions[k]
                return True
        return False


def _tiles(r: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`r` cut into blocks of `shape` (a grid: shards are blocks), as a stack of blocks."""
    split = [d for m, n in zip(shape, r.shape) for d in (n // m, m)]
    ndim = len(shape)
    blocks = r.reshape(split).transpose(list(range(0, 2 * ndim, 2)) + list(range(1, 2 * ndim, 2)))
    return blocks.reshape((-1,) + tuple(shape))


def numeric_frontier(
    reference_events: list[Event],
    distributed_events: list[Event],
    consts: dict,
    inputs: tuple[LeafPlacement, ...],
    groups_by_axis: dict[str, list[list[int]]],
    term_count: int,
    routed: frozenset[int] | set[int] = frozenset(),
    budgets: Budgets = Budgets(),
) -> NumericFrontier:
    """The first distributed op whose value is no window of any reference value, on any device.
    `routed`: ids of MoE dispatch masks and routed rows (related only through their combine)."""
    if term_count > budgets.numeric_terms:
        return NumericFrontier(
            None, note=f"numeric localization skipped: {term_count} terms (limit {budgets.numeric_terms})"
        )
    if sum(math.prod(leaf.shape) for leaf in inputs) > budgets.numeric_elements:
        return NumericFrontier(
            None, note=f"numeric localization skipped: inputs over {budgets.numeric_elements} elements"
        )
    if JAX_FORKED:
        return NumericFrontier(
            None,
            note="numeric localization skipped: the verifier was forked from a process "
            "running jax, whose runtime a fork does not carry",
        )
    try:
        params = draw_inputs(inputs)
    except Exception as exc:  # noqa: BLE001 - an aid to the finding: its failure must not cost the verdict
        return NumericFrontier(None, note=f"numeric localization skipped: the random inputs could not be drawn ({exc})")
    values = _Values(params, consts)
    index = _ReferenceIndex()
    reference_ids = set()
    for position, e in enumerate(reference_events):
        v = e.values[0]
        if isinstance(v, Term) and id(v) not in reference_ids:
            reference_ids.add(id(v))
            found = values(v)
            if found is not None:
                index.add(found, position)
    verdict: dict[int, bool] = {}  # id(term) -> matches
    compared = 0
    for event in distributed_events:
        terms = event.values
        if event.inst.opcode in TRIVIAL_OPS or any(not isinstance(t, Term) or id(t) in routed for t in terms):
            continue
        evaluated = [values(t) for t in terms]
        arrays = [a for a in evaluated if a is not None]
        if len(arrays) < len(evaluated):
            continue
        compared += 1
        for dev, (t, a) in enumerate(zip(terms, arrays)):
            if id(t) not in verdict:
                verdict[id(t)] = (
                    id(t) in reference_ids or index.matches(a) or _partial(index, arrays, dev, groups_by_axis)
                )
            if not verdict[id(t)]:
                return NumericFrontier(event, dev, compared)
    return NumericFrontier(None, compared=compared)


def _partial(
    index: _ReferenceIndex, arrays: list[np.ndarray], dev: int, groups_by_axis: dict[str, list[list[int]]]
) -> bool:
    """The sum over the devices of some mesh axis matches: a partial sum awaiting its all-reduce."""
    for groups in groups_by_axis.values():
        group = next((g for g in groups if dev in g), None)
        if group is None or len(group) < 2 or any(arrays[d].shape != arrays[dev].shape for d in group):
            continue
        if arrays[dev].dtype.kind in "fc" and index.matches(np.sum([arrays[d] for d in group], axis=0)):
            return True
    return False
