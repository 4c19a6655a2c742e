"""Candidate relations from concrete values: hints for the proof, never a verdict.

The rules relate a distributed value to a window of a reference value most easily from the window's
side: pushing the window into the reference term meets the device's term (a device's RoPE
rotation `x1[heads] * cos[rows] - ...` is the reference's rotation at its rows and heads, but
lifting the windows out of the device's term stops where its slices nest in another order). The
window the proof needs is not known until something proposes it. Here both programs are evaluated
on one random draw; each distributed value on each device that equals a block of a reference value
(its shard, in the grid of blocks of its own shape) proposes that block of the reference term. The
proposals are loaded into the e-graph as plain terms: equality saturation alone decides whether a
device's value is that window, so a wrong proposal (values that agree on this draw by accident)
costs a term and proves nothing.

Cost: every term is evaluated once (numpy); each distributed value is compared with the reference
values of its dtype and rank, nearest in program order first, and at most `window_candidates`
(equivci.options.Budgets) blocks are proposed.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from equivci.hlo.ir import TRIVIAL_OPS
from equivci.terms.ir import Term
from equivci.terms.semantics import TermEvalError, evaluate
from equivci.translate.evaluator import Evaluator, Event

# Values agree to this relative distance when the programs compute them alike (a proposal only
# costs a term: it does not need to be tight, only not to match everything).
_RTOL, _ATOL = 1e-4, 1e-5


def window_candidates(
    reference_events: list[Event], distributed_events: list[Event], evaluator: Evaluator, params: dict[int, np.ndarray]
) -> list[Term]:
    """The blocks of reference values that distributed values equal on the draw `params`."""
    memo: dict[int, np.ndarray] = {}

    def value(t: Term) -> np.ndarray | None:
        try:
            return evaluate(t, params, evaluator.values, memo)
        except (TermEvalError, KeyError, ValueError, TypeError, IndexError):
            return None

    by_kind: dict[tuple, list[tuple[int, Term, np.ndarray]]] = {}
    for position, event in enumerate(reference_events):
        t = event.values[0]
        found = value(t) if isinstance(t, Term) and t.op not in ("param", "const") else None
        if found is not None and found.size:
            by_kind.setdefault((found.dtype.str, found.ndim), []).append((position, t, found))
    proposed: dict[Term, None] = {}
    near = 0
    for event in distributed_events:
        if event.inst.opcode in TRIVIAL_OPS:  # its value is an operand's, or no computation: nothing to propose
            continue
        for t in event.values:
            if not isinstance(t, Term) or t.op in ("param", "const"):
                continue
            a = value(t)
            if a is None or not a.size or a.dtype.kind != "f":
                continue
            match = _block_of(by_kind.get((a.dtype.str, a.ndim), []), a, near)
            if match is None:
                continue
            near, term, windows = match
            block = evaluator.slice_nd(term, windows)
            if block is not term:
                proposed.setdefault(block, None)
            if len(proposed) >= evaluator.budgets.window_candidates:
                return list(proposed)
    return list(proposed)


def _block_of(values: list[tuple[int, Term, np.ndarray]], a: np.ndarray, near: int):
    """(position, reference term, windows) of the first reference value, nearest `near` in program
    order, with a block of `a`'s shape equal to `a`; windows as (start, stop) per dim."""
    if not values:
        return None
    positions = [p for p, _, _ in values]
    start = bisect.bisect_left(positions, near)
    order = (
        k
        for pair in itertools.zip_longest(range(start, len(values)), range(start - 1, -1, -1))
        for k in pair
        if k is not None
    )
    finite = np.abs(a[np.isfinite(a)])
    atol = _ATOL * max(1.0, float(finite.max())) if finite.size else _ATOL
    first = a.flat[0]
    for k in order:
        position, term, r = values[k]
        if any(n < m or n % m for m, n in zip(a.shape, r.shape)):
            continue
        # The first element of every block at once (one numpy call, not one per block): only the
        # blocks whose first element is close can be close everywhere.
        corners = r[tuple(slice(None, None, m) for m in a.shape)]
        for block in np.argwhere(np.isclose(corners, first, rtol=_RTOL, atol=atol, equal_nan=True)):
            index = tuple(slice(b * m, (b + 1) * m) for b, m in zip(block.tolist(), a.shape))
            if np.allclose(r[index], a, rtol=_RTOL, atol=atol, equal_nan=True):
                return position, term, [(s.start, s.stop) for s in index]
    return None
